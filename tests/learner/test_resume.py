"""A learner SIGKILLed after its step-k checkpoint resumes at step k+1 with the same data order and,
on CPU, reaches bit-identical weights after step k+2 compared with an uninterrupted run.

Bit-identical (not merely close) because everything a step computes is restored exactly: float32
weights from safetensors, AdamW moments and step counts from optimizer.pt, the LR from the rollout
counter, the rows from (seed, step); the micro-batch plan and every reduction run in the same order
on the same thread count, and nothing random is drawn (dropout is off).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from grove.store_layout import checkpoint_prefix
from storage.local import LocalStore
from tests.learner import resume_worker
from trainer.checkpoint import latest_committed_step
from trainer.learner import Learner

REPO = Path(__file__).resolve().parents[2]
K = 2


def _start_worker(model_dir: Path, root: Path, run_id: str, sentinel: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "tests.learner.resume_worker", str(model_dir), str(root), run_id, str(K + 2),
        "--pause-before-commit", str(K + 1), "--sentinel", str(sentinel),
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sigkilled_learner_resumes_bit_identically(learner_model_dir, tmp_path):
    root, sentinel, run_id = tmp_path / "store", tmp_path / "paused", "run-resume"
    proc = _start_worker(learner_model_dir, root, run_id, sentinel)
    try:
        # Meanwhile, the uninterrupted run in this process.
        straight = Learner(learner_model_dir, resume_worker.CONFIG, device="cpu")
        straight_metrics = []
        for step in range(1, K + 3):
            straight_metrics.append(
                straight.step(resume_worker.rows_for_step(step, straight.model.config.vocab_size))
            )
        deadline = time.monotonic() + 240
        while not sentinel.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the learner process never reached step K+1's commit"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    store = LocalStore(root)
    assert store.exists(checkpoint_prefix(run_id, K + 1) + "optimizer.pt")  # step K+1 half-written...
    assert latest_committed_step(store, run_id) == K  # ...but invisible: resume from K

    resumed = resume_worker.run(learner_model_dir, store, run_id, K + 2, tmp_path)
    assert (resumed.step_count, resumed.rollouts_consumed) == (K + 2, (K + 2) * 6)
    assert latest_committed_step(store, run_id) == K + 2
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name}: max abs diff {float((a - b).abs().max())}"
    for a, b in zip(
        straight.optimizer.state_dict()["state"].values(),
        resumed.optimizer.state_dict()["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert straight_metrics[-1].loss != straight_metrics[-2].loss  # the steps really differ
