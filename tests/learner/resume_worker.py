"""A learner process for the resume test: trains steps with a checkpoint after each, resuming from
the latest committed checkpoint if there is one. With --pause-before-commit N it stops dead just
before writing step N's COMMIT marker (after writing its other files), writes a sentinel file and
sleeps, so the test can SIGKILL it at exactly that point.

    python -m tests.learner.resume_worker MODEL_DIR STORE_ROOT RUN_ID LAST_STEP \
        [--pause-before-commit N --sentinel PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import torch

from bench.forests import random_episode, rows_from_calls
from grove.data_order import task_indices
from grove.learner_config import LearnerConfig
from grove.store_layout import commit_key
from storage.local import LocalStore
from trainer.checkpoint import open_learner, save_checkpoint
from trainer.learner import Learner
from trainer.rows import Row

CONFIG = LearnerConfig(lr=3e-3, seed=11, rollouts_per_step=6, micro_batch_tokens=256, weight_decay=0.01)
TASKS_PER_STEP, GROUP_SIZE, NUM_TASKS = 2, 3, 5


def rows_for_step(step: int, vocab: int) -> list[Row]:
    """The step's rows: its tasks come from the data order, each task's episodes from (task, step)."""
    import numpy as np

    rows = []
    for task in task_indices(CONFIG.seed, step, TASKS_PER_STEP, NUM_TASKS):
        seed = int.from_bytes(hashlib.sha256(f"{task}:{step}".encode()).digest()[:4], "big")
        rng = np.random.default_rng(seed)
        for j in range(GROUP_SIZE):
            ep = random_episode(rng, f"s{step}/t{task}/g{j}", f"s{step}/t{task}", float(rng.integers(0, 3)),
                                vocab=vocab, size=3)  # fmt: skip
            rows += rows_from_calls(ep)
    return rows


class PausingStore:
    """A LocalStore that freezes the process right before one COMMIT write."""

    def __init__(self, inner: LocalStore, key: str | None, sentinel: Path | None) -> None:
        self.inner, self.key, self.sentinel = inner, key, sentinel

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key: str, data: bytes) -> None:
        if key == self.key:
            self.sentinel.write_text("paused")
            while True:
                time.sleep(60)
        self.inner.put(key, data)


def run(model_dir: Path, store, run_id: str, last_step: int, work: Path) -> Learner:
    learner = open_learner(store, run_id, model_dir, CONFIG, work, device="cpu")
    for step in range(learner.step_count + 1, last_step + 1):
        learner.step(rows_for_step(step, learner.model.config.vocab_size))
        save_checkpoint(store, run_id, learner)
    return learner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir", type=Path)
    p.add_argument("store_root", type=Path)
    p.add_argument("run_id")
    p.add_argument("last_step", type=int)
    p.add_argument("--pause-before-commit", type=int)
    p.add_argument("--sentinel", type=Path)
    a = p.parse_args()
    torch.set_num_threads(1)  # the same reduction order as the test process
    key = commit_key(a.run_id, a.pause_before_commit) if a.pause_before_commit else None
    store = PausingStore(LocalStore(a.store_root), key, a.sentinel)
    run(a.model_dir, store, a.run_id, a.last_step, a.store_root.parent)


if __name__ == "__main__":
    main()
