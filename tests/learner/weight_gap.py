"""How far two trainings of the same weights disagree, relative to how far training moved them: the
comparison the rank tests (tests/learner/test_train_ranks.py, tests/durability/test_trainer_ranks.py)
make between a step trained on several processes and the same step in one."""

from __future__ import annotations

import torch


def model_norm(tensors: dict[str, torch.Tensor]) -> float:
    """The norm of all the tensors' entries as one vector."""
    return sum(float(t.double().norm()) ** 2 for t in tensors.values()) ** 0.5


def relative_gap(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], base: dict[str, torch.Tensor]
) -> float:
    """||a - b|| / ||b - base|| over the whole model as one vector. Not per tensor: entries whose gradient
    is within rounding of zero move by an amount the summation order decides (AdamW divides by sqrt(v)),
    and one of them in a small tensor is a large share of that tensor's movement."""
    moved = model_norm({k: b[k] - base[k] for k in base})
    return model_norm({k: a[k] - b[k] for k in base}) / max(moved, 1e-30)
