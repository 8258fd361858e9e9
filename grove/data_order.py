"""Which dataset tasks a training step uses: a pure function of (seed, step).

PURE STDLIB ONLY: the Temporal training-run workflow imports this module inside its sandbox, and a
resumed learner must see the same tasks at the same step, so nothing here may depend on state,
clocks or the order of earlier calls.

The task stream is a sequence of epochs; epoch e is a permutation of range(num_tasks) shuffled by
`random.Random` seeded from sha256("grove-data-order", seed, e). Step N (1-based: step N produces
policy version N) takes the `tasks_per_step` consecutive stream positions starting at
(N - 1) * tasks_per_step, so a step may straddle two epochs. Every task appears exactly once per
epoch. The data cursor of a checkpoint is therefore just the step.
"""

from __future__ import annotations

import hashlib
import random


class DataOrderError(ValueError):
    """Arguments of `task_indices` out of range (step < 1, empty dataset, non-positive batch)."""


def _epoch_permutation(seed: int, epoch: int, num_tasks: int) -> list[int]:
    # A hash of (seed, epoch) rather than seed + epoch, so neighbouring seeds do not share epochs.
    digest = hashlib.sha256(f"grove-data-order:{seed}:{epoch}".encode()).digest()
    order = list(range(num_tasks))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


def task_indices(seed: int, step: int, tasks_per_step: int, num_tasks: int) -> list[int]:
    """The dataset indices of the tasks of optimizer step `step` (1-based), in order.

    Raises:
        DataOrderError: step < 1, tasks_per_step < 1 or num_tasks < 1.
    """
    for name, value in (("step", step), ("tasks_per_step", tasks_per_step), ("num_tasks", num_tasks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DataOrderError(
                f"task_indices: {name} must be an integer >= 1, got {value!r} "
                "(steps count from 1: step N produces policy version N)"
            )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise DataOrderError(f"task_indices: seed must be an integer, got {seed!r}")
    first = (step - 1) * tasks_per_step
    out: list[int] = []
    epoch, cached = -1, []
    for pos in range(first, first + tasks_per_step):
        if pos // num_tasks != epoch:
            epoch = pos // num_tasks
            cached = _epoch_permutation(seed, epoch, num_tasks)
        out.append(cached[pos % num_tasks])
    return out
