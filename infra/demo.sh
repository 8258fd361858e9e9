#!/usr/bin/env bash
# grove's main job: installs (infra/bootstrap.sh), builds the tiny model, starts the Temporal dev server
# (UI on http://127.0.0.1:8233) and the workers, and trains parent+worker GRPO beside the parent-only
# baseline. Ctrl-C and run it again: it resumes the same runs.
#   bash infra/demo.sh [--model smollm2] [--steps N] [--name NAME]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash infra/bootstrap.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${GROVE_VENV:-$ROOT/.venv}/bin/grove" demo "$@"
