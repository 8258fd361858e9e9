#!/usr/bin/env bash
# grove's test command: creates/reuses the venv (infra/bootstrap.sh), then runs the whole suite against
# real services that the tests start themselves (Temporal dev server, S3 server, vLLM) on free ports.
#   bash infra/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash infra/bootstrap.sh
bash infra/chromium.sh  # the viewer tests drive a real headless Chromium (tests/viewer/)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${GROVE_VENV:-$ROOT/.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
