"""Bounded staleness of asynchronous GRPO: how old each trained token's policy is, and the limit.

Step N updates the weights of policy version N - 1. A loss token sampled by version v has lag
(N - 1) - v: 0 for every token of a synchronous run, at most `max_policy_lag` in an overlapped one
(RunConfig.max_policy_lag). The run workflow keeps that bound by what it lets engines serve
(workflows/training_run.py min_version); the learner checks it again, so a token outside the bound can
never be trained, and measures the lag distribution. Stale tokens (lag > 0) are trained with truncated
importance sampling (trainer/loss.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from trainer.batch import MicroBatch, valid_rows
from trainer.rows import Row


class PolicyLagError(ValueError):
    """A loss token sampled by a policy version further behind (or ahead) than the run allows."""


def token_lags(rows: Sequence[Row], version: int) -> np.ndarray:
    """Lag (version - sampling version) of every loss token of the valid rows: int64 [loss tokens]."""
    lags = [
        np.full(s.end - s.start, version - s.policy_version, dtype=np.int64)
        for row in valid_rows(rows)
        for s in row.spans
        if s.owned and s.eligible
    ]
    return np.concatenate(lags) if lags else np.zeros(0, dtype=np.int64)


def check_policy_lag(rows: Sequence[Row], version: int, max_lag: int) -> None:
    """Refuse a batch for the weights of `version` holding a token sampled more than `max_lag` versions
    before them, or by a version newer than them (which no correct run can produce)."""
    for row in valid_rows(rows):
        for s in row.spans:
            if not (s.owned and s.eligible):
                continue
            lag = version - s.policy_version
            if lag < 0 or lag > max_lag:
                raise PolicyLagError(
                    f"row {row.row_id!r} of episode {row.episode_id!r}: call {s.call_id!r} was sampled by "
                    f"policy version {s.policy_version}, the step updates version {version} "
                    f"(lag {lag}, allowed 0..{max_lag}); the episode ran on an engine outside the run's "
                    "bounds: re-run the step's episodes, or raise max_policy_lag"
                )


def lag_metrics(rows: Sequence[Row], version: int) -> dict[str, float]:
    """The lag distribution of the batch's loss tokens: mean, max, and tokens per lag value."""
    lags = token_lags(rows, version)
    out: dict[str, float] = {
        "lag_mean": float(lags.mean()) if lags.size else 0.0,
        "lag_max": float(lags.max()) if lags.size else 0.0,
    }
    for value, count in zip(*np.unique(lags, return_counts=True), strict=True):
        out[f"lag_tokens_{int(value)}"] = float(count)
    return out


def stale_mask(mb: MicroBatch, version: int | None) -> Tensor | None:
    """bool [N]: loss tokens of `mb` sampled by a version older than `version` (None: not known)."""
    if version is None or mb.policy_version is None:
        return None
    return mb.policy_version < version
