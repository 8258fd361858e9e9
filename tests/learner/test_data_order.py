"""Data order is a pure function of (seed, step): epochs are permutations, steps tile the stream."""

from __future__ import annotations

import pytest

from grove.data_order import DataOrderError, task_indices


def test_each_epoch_is_a_permutation_and_steps_tile_the_stream():
    # 10 tasks, 4 per step: steps 1-5 cover stream positions 0..19 = exactly two epochs.
    stream = [
        i for step in range(1, 6) for i in task_indices(seed=3, step=step, tasks_per_step=4, num_tasks=10)
    ]
    assert sorted(stream[:10]) == list(range(10))
    assert sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # a new shuffle per epoch (probability 1/10! of a false failure)


def test_same_seed_and_step_give_the_same_tasks_regardless_of_history():
    later_first = task_indices(seed=7, step=9, tasks_per_step=3, num_tasks=50)
    for step in range(1, 9):
        task_indices(seed=7, step=step, tasks_per_step=3, num_tasks=50)
    assert task_indices(seed=7, step=9, tasks_per_step=3, num_tasks=50) == later_first


def test_different_seeds_give_different_orders():
    a = [task_indices(seed=0, step=s, tasks_per_step=8, num_tasks=100) for s in (1, 2)]
    b = [task_indices(seed=1, step=s, tasks_per_step=8, num_tasks=100) for s in (1, 2)]
    assert a != b


def test_module_is_pure_stdlib():
    import ast
    from pathlib import Path

    import grove.data_order as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "hashlib", "random"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed": 0, "step": 0, "tasks_per_step": 1, "num_tasks": 1},
        {"seed": 0, "step": 1, "tasks_per_step": 0, "num_tasks": 1},
        {"seed": 0, "step": 1, "tasks_per_step": 1, "num_tasks": 0},
        {"seed": "x", "step": 1, "tasks_per_step": 1, "num_tasks": 1},
    ],
)
def test_bad_arguments_are_named(kwargs):
    with pytest.raises(DataOrderError, match="task_indices"):
        task_indices(**kwargs)
