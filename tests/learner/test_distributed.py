"""Two gloo ranks with FSDP2 (trainer/distributed.py) take the same step as the single-process learner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grove.learner_config import LearnerConfig
from tests.bounds import PROCESS_WAIT
from tests.learner.test_reference import controlled_batch, rows_of
from trainer.distributed import split_micro_batches
from trainer.learner import Learner, prepare_batch

ROOT = Path(__file__).resolve().parents[2]


def test_split_balances_forwarded_tokens_and_covers_every_micro_batch():
    plan = prepare_batch(
        rows_of(controlled_batch(512)), LearnerConfig(layout="packed", micro_batch_tokens=64)
    ).plan
    shares = split_micro_batches(plan, 2)
    assert sorted(i for s in shares for i in s) == list(range(len(plan)))
    loads = [sum(plan[i].real_tokens for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(mb.real_tokens for mb in plan)


@pytest.mark.parametrize("layout", ["packed", "tree"])
def test_two_gloo_ranks_equal_the_single_process_learner(small_model_dir, tmp_path, layout):
    out = tmp_path / "dist.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    worker = ROOT / "tests/learner/distributed_worker.py"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker)]
    subprocess.run(
        [*cmd, str(small_model_dir), layout, str(out)], check=True, env=env, cwd=ROOT, timeout=PROCESS_WAIT
    )
    got = torch.load(out, weights_only=False)
    single = Learner(
        small_model_dir, LearnerConfig(lr=1e-3, layout=layout, micro_batch_tokens=64), device="cpu"
    )
    before = {k: v.detach().clone() for k, v in single.model.state_dict().items()}
    metrics = single.step(rows_of(controlled_batch(512)))
    assert got["metrics"]["loss"] == pytest.approx(metrics.loss, rel=1e-6)
    assert got["metrics"]["grad_norm"] == pytest.approx(metrics.grad_norm, rel=1e-5)
    for name, w in single.model.state_dict().items():
        moved = (w - before[name]).norm()
        assert moved > 0, name
        assert float((got["weights"][name] - w).norm()) <= 1e-5 * float(moved), name
