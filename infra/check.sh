#!/usr/bin/env bash
# grove's static checks, from the repository root with the venv's tools (infra/bootstrap.sh installs
# them with the `dev` extra): ruff lint, ruff format check, mypy (its files and settings: pyproject.toml
# [tool.mypy]). Every step runs; the ones that failed are named at the end and the exit status is 1.
#   bash infra/check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${GROVE_VENV:-$ROOT/.venv}/bin"
for tool in ruff mypy; do
  if [[ ! -x "$BIN/$tool" ]]; then
    echo "check: $BIN/$tool not found; run infra/bootstrap.sh first (or set GROVE_VENV to the venv)" >&2
    exit 2
  fi
done

failed=()
step() {
  local name="$1"
  shift
  echo "== $name: $*"
  if ! "$@"; then
    echo "check: step '$name' failed" >&2
    failed+=("$name")
  fi
}

step lint "$BIN/ruff" check .
step format "$BIN/ruff" format --check .
step types "$BIN/mypy"

if ((${#failed[@]})); then
  echo "check: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "check: all passed (lint, format, types)"
