"""GRPO advantages over logical rollouts (episodes), fanned out to the rows each episode owns.

Rules (DESIGN.md section 7; NeMo RL's logical-owner GRPO is the prior art):
- An episode counts once in its group's baseline however many rows it has. Its reward must be the
  same on all its rows, and all its rows must name the same group.
- An episode is valid only if all its rows are valid. Invalid (failed-placeholder) episodes are
  excluded from the baseline and get advantage 0; their rows carry no loss.
- A = (r - mean) / (std + eps) over the group's valid episodes, std the *sample* standard deviation
  (ddof=1, as TRL and NeMo RL compute it); with std scaling off, A = r - mean.
- A group with fewer than two valid episodes (a singleton, or all failed) gives advantage 0 to all
  its episodes: there is no baseline to compare with, and a lone episode's A would be 0 anyway.
- A group whose valid rewards are all equal gives 0 (std 0, numerator 0), never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainer.rows import Row


class EpisodeRowsMismatchError(ValueError):
    """Rows of one episode disagree on its reward or its group."""


class NonFiniteRewardError(ValueError):
    """A valid episode has a NaN or infinite reward."""


@dataclass(frozen=True)
class EpisodeAdvantage:
    episode_id: str
    group_id: str
    reward: float
    valid: bool
    advantage: float


def group_advantages(rewards: np.ndarray, valid: np.ndarray, *, std_scaling: bool, eps: float) -> np.ndarray:
    """Advantages of one group's episodes: rewards float [G], valid bool [G] -> float64 [G]."""
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = np.asarray(valid, dtype=bool)
    out = np.zeros(rewards.shape, dtype=np.float64)
    if valid.sum() < 2:
        return out
    r = rewards[valid]
    centred = r - r.mean()
    out[valid] = centred / (r.std(ddof=1) + eps) if std_scaling else centred
    return out


def _episode_table(rows: Sequence[Row]) -> dict[str, tuple[str, float, bool]]:
    """episode_id -> (group_id, reward, valid), checking that its rows agree."""
    table: dict[str, tuple[str, float, bool]] = {}
    for row in rows:
        seen = table.get(row.episode_id)
        if seen is None:
            table[row.episode_id] = (row.group_id, float(row.reward), bool(row.valid))
            continue
        group_id, reward, valid = seen
        if row.group_id != group_id or not _same_reward(row.reward, reward):
            raise EpisodeRowsMismatchError(
                f"episode {row.episode_id!r}: row {row.row_id!r} has group {row.group_id!r} and reward "
                f"{row.reward!r} but an earlier row has group {group_id!r} and reward {reward!r}; all rows "
                "of an episode must carry its one reward and group (check the materialization)"
            )
        table[row.episode_id] = (group_id, reward, valid and bool(row.valid))
    return table


def _same_reward(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


def episode_advantages(
    rows: Sequence[Row], *, std_scaling: bool = True, eps: float = 1e-6
) -> dict[str, EpisodeAdvantage]:
    """One advantage per episode of `rows`, keyed by episode id (sorted).

    Raises:
        EpisodeRowsMismatchError: an episode's rows disagree on reward or group.
        NonFiniteRewardError: a valid episode's reward is NaN or infinite.
    """
    table = _episode_table(rows)
    for episode_id, (_, reward, valid) in table.items():
        if valid and not np.isfinite(reward):
            raise NonFiniteRewardError(
                f"episode {episode_id!r} is valid but its reward is {reward!r}; a reward function must "
                "return a finite number, or mark the episode failed (valid=False) so it gets no loss"
            )
    groups: dict[str, list[str]] = {}
    for episode_id in sorted(table):
        groups.setdefault(table[episode_id][0], []).append(episode_id)
    out: dict[str, EpisodeAdvantage] = {}
    for group_id in sorted(groups):
        members = groups[group_id]
        rewards = np.array([table[e][1] if table[e][2] else 0.0 for e in members])
        valid = np.array([table[e][2] for e in members])
        adv = group_advantages(rewards, valid, std_scaling=std_scaling, eps=eps)
        for episode_id, a in zip(members, adv, strict=True):
            _, reward, ok = table[episode_id]
            out[episode_id] = EpisodeAdvantage(episode_id, group_id, reward, ok, float(a))
    return dict(sorted(out.items()))
