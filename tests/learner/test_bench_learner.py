"""bench/bench_learner.py runs every section with tiny sizes, and the learner's GPU path imports without
Temporal or vLLM (the GPU machine it is meant for has neither) and the benchmark without the tests (a
benchmark imports only the product and bench/).

Both run in a subprocess whose importer refuses `temporalio`, `vllm` and `tests`
(tests/learner/blocked_imports.py), so an import of any of them anywhere on the path fails the test.
The CUDA code paths that a CPU can run run here too: the layouts section on `--device cpu` (the same
code measures CUDA with synchronised wall time and max_memory_allocated), the MFU section with the
CPU's measured float32 matmul peak, and the memory section's probes for two vocabularies.
Figures are not asserted (they belong to the benchmark).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "temporalio,vllm,tests"


def run_blocked(*args: str, timeout: int = 900) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, str(ROOT / "tests/learner/blocked_imports.py"), BLOCKED, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_the_learner_path_imports_without_temporal_vllm_or_tests():
    out = run_blocked(
        "-c", "import trainer.learner, trainer.distributed, trainer.checkpoint, bench.bench_learner"
    )
    assert "blocked" not in out


def test_the_blocker_blocks():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(ROOT / "tests/learner/blocked_imports.py"),
        BLOCKED,
        "-c",
        "import activities.training",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode != 0 and "temporalio" in out.stderr


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
def test_every_section_runs_on_cpu_with_tiny_sizes():
    out = run_blocked(
        "bench/bench_learner.py", "--model-shape", "tiny", "--device", "cpu", "--parent-tokens", "64",
        "--reps", "1", "--reps-long", "1", "--mfu-tokens", "512", "--mfu-row", "256", "--hf",
        "--agreement", "1", "--memory", "256,512", "--memory-vocabs", "512,4096",
    )  # fmt: skip
    for layout in ("padded rows", "packed rows", "tree", "per-call rows"):
        timed = re.findall(rf"^{layout} +\d+ +\d+ +\d+\.\d+ +\d+ ", out, re.M)
        assert len(timed) == 2, out  # scenarios (a) and (b)
        checked = re.findall(rf"^{layout} +\d+ +\S+ +\S+ +\S+ +ok$", out, re.M)
        assert len(checked) == 2, out  # one micro-batch and many
    assert re.search(r"^learner step +[\d.]+ +[\d.]+ +[\d.]+% ", out, re.M), out
    assert re.search(r"^forward\+backward +[\d.]+ ", out, re.M), out
    assert "float32 1024x1024 matmul" in out
    for vocab in (512, 4096):
        for head in ("chunked", "chunked\\+ckpt", "full logits"):
            assert re.search(rf"^ *{vocab} {head} +-?\d+ +-?\d+ +-?\d+$", out, re.M), out
    assert "learner vs HF" in out
    assert "agreement: every layout within tolerance" in out, out  # float32 on CPU: 1e-5
