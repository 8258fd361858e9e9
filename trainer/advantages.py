"""GRPO advantages over logical rollouts (episodes), fanned out to the rows each episode owns.

The baseline is computed over *episode records* (grove/episodes.py), not over rows: an episode
that produced no rows (only an auxiliary call, no model call at all) or whose child workflow died
before publishing any is still a logical rollout of its group, and rows alone cannot see it.

    advantages = episode_advantages(rows, episodes, std_scaling=True, eps=1e-6, failure_reward=0.0)

Rules (docs/design.md section 7; NeMo RL's logical-owner GRPO is the prior art):
- Every episode record counts once in its group, whether it has 0, 1 or many rows. Rows only
  carry the advantage to tokens: each row must belong to a record (`UnknownEpisodeError`), carry
  its record's reward and group and agree with its status (`EpisodeRowsMismatchError`), and when
  a record says how many rows it published, the batch must hold exactly that many
  (`EpisodeRowCountError`).
- Failure rule. An ok episode enters the baseline with its reward. A failure caused by the policy's
  own behaviour (`failure_kind="policy"`: malformed tool call / native harness error, an external
  harness's reported failure, prompt too long, a generation refused for the policy's request)
  enters the baseline with the configured `failure_reward` (LearnerConfig.failure_reward, default
  0.0), so a group where the policy keeps failing is not scored as if those attempts never
  happened; its rows carry no loss (advantage 0), it acts only through the baseline. A failure of
  the infrastructure (`"infrastructure"`: lost attempts exhausted, child workflow failed /
  terminated / timed out, store down) says nothing about the policy: it is excluded from the
  baseline, gets advantage 0, and the step's metrics count it (trainer/learner.py StepMetrics,
  grove.contracts.StepRecord).
- A = (r - mean) / (std + eps) over the group's baseline episodes, std the *sample* standard
  deviation (ddof=1, as TRL and NeMo RL compute it); with std scaling off, A = r - mean.
- A group with fewer than two baseline episodes (a singleton, or all excluded) gives advantage 0 to
  all its episodes: there is no baseline to compare with, and a lone episode's A would be 0 anyway.
- A group whose baseline rewards are all equal gives 0 (std 0, numerator 0), never NaN.

Without records (`episodes=None`, the rows-only form kept for callers that only have rows) the
records are derived from the rows: valid rows -> an ok episode, a `valid=False` placeholder -> a
failed episode whose kind rows cannot tell, so it is excluded like an infrastructure failure. That
form cannot see zero-row episodes: anything that trains must pass the records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from grove.episodes import EpisodeRecord
from trainer.rows import Row


class EpisodeRowsMismatchError(ValueError):
    """Rows of one episode disagree with each other or with its record (reward, group, status)."""


class NonFiniteRewardError(ValueError):
    """A valid episode has a NaN or infinite reward."""


class UnknownEpisodeError(ValueError):
    """A row belongs to no episode record of the batch."""


class DuplicateEpisodeError(ValueError):
    """Two episode records of the batch share an episode id."""


class EpisodeRowCountError(ValueError):
    """An episode record says it published N rows; the batch holds another number of its rows."""


@dataclass(frozen=True)
class EpisodeAdvantage:
    episode_id: str
    group_id: str
    reward: float  # the episode's own reward
    valid: bool  # its rows carry loss (status ok)
    advantage: float  # the value fanned out to its loss tokens (0 when not valid)
    status: str = "ok"
    failure_kind: str | None = None
    in_baseline: bool = True  # counted in its group's mean/std
    baseline_reward: float | None = None  # the value it entered the baseline with; None: excluded


def group_advantages(rewards: np.ndarray, valid: np.ndarray, *, std_scaling: bool, eps: float) -> np.ndarray:
    """Advantages of one group's episodes: rewards float [G], valid (in baseline) bool [G] -> float64 [G]."""
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = np.asarray(valid, dtype=bool)
    out = np.zeros(rewards.shape, dtype=np.float64)
    if valid.sum() < 2:
        return out
    r = rewards[valid]
    centred = r - r.mean()
    out[valid] = centred / (r.std(ddof=1) + eps) if std_scaling else centred
    return out


def _same_reward(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


def records_from_rows(rows: Sequence[Row]) -> list[EpisodeRecord]:
    """The rows-only view: one record per episode seen in `rows` (zero-row episodes are invisible).

    An episode with any `valid=False` row is failed with kind "infrastructure" (excluded): a
    placeholder row cannot say why its episode failed. Rows of one episode must agree.
    """
    first: dict[str, Row] = {}
    invalid: set[str] = set()
    for row in rows:
        seen = first.setdefault(row.episode_id, row)
        if row.group_id != seen.group_id or not _same_reward(float(row.reward), float(seen.reward)):
            raise EpisodeRowsMismatchError(
                f"episode {row.episode_id!r}: row {row.row_id!r} has group {row.group_id!r} and reward "
                f"{row.reward!r} but row {seen.row_id!r} has group {seen.group_id!r} and reward "
                f"{seen.reward!r}; all rows of an episode must carry its one reward and group (check the "
                "materialization)"
            )
        if not row.valid:
            invalid.add(row.episode_id)
    return [
        EpisodeRecord(
            episode_id=e,
            group_id=r.group_id,
            reward=float(r.reward),
            status="failed" if e in invalid else "ok",
            failure_kind="infrastructure" if e in invalid else None,
            failure="unclassified: rows carry no failure kind" if e in invalid else None,
        )  # fmt: skip
        for e, r in first.items()
    ]


def check_records(
    rows: Sequence[Row], episodes: Sequence[EpisodeRecord], *, check_status: bool = True
) -> dict[str, EpisodeRecord]:
    """Records by episode id, after checking that `rows` agree with them (see the module docstring).

    `check_status=False` (rows-only form) lets one invalid row invalidate an otherwise valid episode.
    """
    table: dict[str, EpisodeRecord] = {}
    for rec in episodes:
        if rec.episode_id in table:
            raise DuplicateEpisodeError(
                f"episode {rec.episode_id!r} has two records in the batch; a logical rollout counts once "
                "(check the step's episode list)"
            )
        table[rec.episode_id] = rec
    counts: Counter[str] = Counter()
    for row in rows:
        found = table.get(row.episode_id)
        if found is None:
            raise UnknownEpisodeError(
                f"row {row.row_id!r} belongs to episode {row.episode_id!r}, which has no record in the "
                f"batch ({len(table)} records); pass an EpisodeRecord for every episode of the step"
            )
        _check_row_against(row, found, check_status)
        counts[row.episode_id] += 1
    for rec in episodes:
        if rec.num_rows is not None and counts[rec.episode_id] != rec.num_rows:
            raise EpisodeRowCountError(
                f"episode {rec.episode_id!r} published {rec.num_rows} rows (rows_key {rec.rows_key!r}) "
                f"but the batch holds {counts[rec.episode_id]}; load every row file of the step"
            )
    return table


def _check_row_against(row: Row, rec: EpisodeRecord, check_status: bool) -> None:
    if row.group_id != rec.group_id or not _same_reward(float(row.reward), rec.reward):
        raise EpisodeRowsMismatchError(
            f"episode {rec.episode_id!r}: row {row.row_id!r} has group {row.group_id!r} and reward "
            f"{row.reward!r} but its record says group {rec.group_id!r} and reward {rec.reward!r}; rows "
            "and record must carry the episode's one reward and group (check the materialization)"
        )
    if check_status and bool(row.valid) != rec.trained:
        raise EpisodeRowsMismatchError(
            f"episode {rec.episode_id!r}: row {row.row_id!r} has valid={row.valid} but the record's status "
            f"is {rec.status!r}; an ok episode publishes valid rows, a failed one only its placeholder"
        )


def _baseline_reward(rec: EpisodeRecord, failure_reward: float) -> float | None:
    if rec.status == "ok":
        if not np.isfinite(rec.reward):
            raise NonFiniteRewardError(
                f"episode {rec.episode_id!r} is valid but its reward is {rec.reward!r}; a reward function "
                "must return a finite number, or mark the episode failed so it gets no loss"
            )
        return rec.reward
    return failure_reward if rec.in_baseline else None


def episode_advantages(
    rows: Sequence[Row],
    episodes: Sequence[EpisodeRecord] | None = None,
    *,
    std_scaling: bool = True,
    eps: float = 1e-6,
    failure_reward: float = 0.0,
) -> dict[str, EpisodeAdvantage]:
    """One advantage per episode record (rows-only: per episode of `rows`), keyed by episode id (sorted).

    Raises:
        EpisodeRowsMismatchError: rows of an episode disagree with each other or its record.
        UnknownEpisodeError: a row of an episode without a record.
        DuplicateEpisodeError: two records with one episode id.
        EpisodeRowCountError: a record's num_rows differs from its rows in the batch.
        NonFiniteRewardError: an ok episode's reward is NaN or infinite.
    """
    if not np.isfinite(failure_reward):
        raise NonFiniteRewardError(f"failure_reward is {failure_reward!r}; it must be a finite number")
    records = records_from_rows(rows) if episodes is None else list(episodes)
    table = check_records(rows, records, check_status=episodes is not None)
    base = {e: _baseline_reward(rec, failure_reward) for e, rec in table.items()}
    groups: dict[str, list[str]] = {}
    for episode_id in sorted(table):
        groups.setdefault(table[episode_id].group_id, []).append(episode_id)
    out: dict[str, EpisodeAdvantage] = {}
    for group_id in sorted(groups):
        members = groups[group_id]
        rewards = np.array([base[e] if base[e] is not None else 0.0 for e in members])
        in_baseline = np.array([base[e] is not None for e in members])
        adv = group_advantages(rewards, in_baseline, std_scaling=std_scaling, eps=eps)
        for episode_id, a in zip(members, adv, strict=True):
            rec = table[episode_id]
            out[episode_id] = EpisodeAdvantage(
                episode_id, group_id, rec.reward, rec.trained, float(a) if rec.trained else 0.0,
                status=rec.status, failure_kind=rec.failure_kind, in_baseline=base[episode_id] is not None,
                baseline_reward=base[episode_id],
            )  # fmt: skip
    return dict(sorted(out.items()))
