"""torchrun worker for test_distributed.py: DistributedLearner steps in memory, rank 0 saves the weights."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from activities.train_ranks import end_rank
from grove.learner_config import LearnerConfig
from tests.learner.test_reference import controlled_batch, rows_of
from trainer.distributed import DistributedLearner


def main(model_dir: str, layout: str, out: str, steps: str = "1") -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    cfg = LearnerConfig(lr=1e-3, layout=layout, micro_batch_tokens=64)
    learner = DistributedLearner(Path(model_dir), cfg, device="cpu")
    for _ in range(int(steps)):  # several steps in one process: the uninterrupted run
        metrics = learner.step(rows_of(controlled_batch(512)))
    weights = learner.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"weights": weights, "metrics": metrics.model_dump()}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    end_rank(lambda: main(*sys.argv[1:]))  # as a production rank ends (no finalization race)
