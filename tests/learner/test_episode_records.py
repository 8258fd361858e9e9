"""Every logical rollout of a group counts once in its baseline, whatever rows it produced.

The batches are built by the real reconstruction (bench/forests.py `rows_from_calls`): an
episode whose only call is auxiliary reconstructs to zero rows, and it must still enter its group's
mean and std, be counted by the learner and satisfy `rollouts_per_step`. Failed episodes follow the
failure rule of trainer/advantages.py. Expected advantages are written out from the formula here,
A = (r - mean) / (sample std + eps), never through group_advantages.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench.forests import Call, Episode, random_episode, rows_from_calls
from grove.episodes import EpisodeRecord
from grove.learner_config import LearnerConfig
from trainer.advantages import (
    DuplicateEpisodeError,
    EpisodeRowCountError,
    EpisodeRowsMismatchError,
    UnknownEpisodeError,
    episode_advantages,
)
from trainer.learner import Learner, prepare_batch

EPS = 1e-6
GROUP = "task-0"


def aux_only_episode(episode_id: str, reward: float) -> Episode:
    """An episode whose only model call is auxiliary (a title call): valid, closed fine, zero rows."""
    prompt = np.arange(3, 9, dtype=np.int32)
    title = Call("aux/c0/000", "parent", "aux/c0", None, prompt, np.array([5, 6, 7], np.int32),
                 np.full(3, -0.5, np.float32), kind="auxiliary")  # fmt: skip
    return Episode(episode_id, GROUP, reward, [title])


def group_of_four(vocab: int = 512) -> tuple[list[Episode], list]:
    """Rewards 1, 0, 0, 0; the last episode (reward 0) made only an auxiliary call."""
    rng = np.random.default_rng(7)
    episodes = [random_episode(rng, f"ep-{j}", GROUP, r, vocab=vocab) for j, r in enumerate([1.0, 0.0, 0.0])]
    episodes.append(aux_only_episode("ep-3", 0.0))
    rows = [r for ep in episodes for r in rows_from_calls(ep)]
    return episodes, rows


def ok(ep: Episode) -> EpisodeRecord:
    return EpisodeRecord(episode_id=ep.episode_id, group_id=ep.group_id, reward=ep.reward)


def test_aux_only_episode_reconstructs_to_zero_rows():
    _, rows = group_of_four()
    assert {r.episode_id for r in rows} == {"ep-0", "ep-1", "ep-2"}  # ep-3 has no row at all


def test_zero_row_episode_enters_its_group_baseline():
    episodes, rows = group_of_four()
    out = episode_advantages(rows, [ok(e) for e in episodes], std_scaling=True, eps=EPS)
    # rewards 1, 0, 0, 0: mean 0.25; sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    assert out["ep-0"].advantage == pytest.approx(0.75 / (0.5 + EPS), rel=1e-12)  # 1.5
    for e in ("ep-1", "ep-2", "ep-3"):
        assert out[e].advantage == pytest.approx(-0.25 / (0.5 + EPS), rel=1e-12)  # -0.5
    assert out["ep-0"].advantage == pytest.approx(1.5, abs=1e-5)
    mean_only = episode_advantages(rows, [ok(e) for e in episodes], std_scaling=False)
    assert {e: a.advantage for e, a in mean_only.items()} == {"ep-0": 0.75, "ep-1": -0.25, "ep-2": -0.25,
                                                             "ep-3": -0.25}  # fmt: skip


def test_prepare_batch_takes_the_records():
    episodes, rows = group_of_four()
    batch = prepare_batch(rows, LearnerConfig(), [ok(e) for e in episodes])
    assert sorted(batch.advantages) == ["ep-0", "ep-1", "ep-2", "ep-3"]
    assert batch.advantages["ep-0"].advantage == pytest.approx(0.75 / (0.5 + 1e-6), rel=1e-12)
    assert batch.advantages["ep-3"].advantage == pytest.approx(-0.25 / (0.5 + 1e-6), rel=1e-12)


def test_learner_counts_four_rollouts_and_rollouts_per_step_is_satisfied(small_model_dir):
    episodes, rows = group_of_four()
    learner = Learner(small_model_dir, LearnerConfig(rollouts_per_step=4), device="cpu")
    metrics = learner.step(rows, [ok(e) for e in episodes])
    assert (metrics.rollouts, metrics.rollouts_consumed, metrics.valid_rollouts) == (4, 4, 4)
    assert (metrics.baseline_rollouts, metrics.excluded_rollouts, metrics.rowless_rollouts) == (4, 0, 1)
    assert metrics.step == 1 and not metrics.skipped


def test_policy_failure_counts_in_the_baseline_with_the_failure_reward():
    episodes, rows = group_of_four()
    # ep-2 failed by its own behaviour (a malformed tool call): its placeholder row, no loss.
    failed = dataclasses.replace(episodes[2], valid=False)
    rows = [r for r in rows if r.episode_id != "ep-2"] + rows_from_calls(failed)[:1]
    records = [ok(episodes[0]), ok(episodes[1]), ok(episodes[3]),
               EpisodeRecord(episode_id="ep-2", group_id=GROUP, reward=0.0, status="failed",
                             failure_kind="policy", failure="malformed tool call")]  # fmt: skip
    out = episode_advantages(rows, records, std_scaling=False, failure_reward=-1.0)
    # baseline rewards 1, 0, -1, 0: mean 0
    assert {e: a.advantage for e, a in out.items()} == {"ep-0": 1.0, "ep-1": 0.0, "ep-2": 0.0, "ep-3": 0.0}
    assert out["ep-2"].in_baseline and out["ep-2"].baseline_reward == -1.0 and not out["ep-2"].valid
    cfg = LearnerConfig(failure_reward=-1.0, adv_std_scaling=False)
    batch = prepare_batch(rows, cfg, records)
    assert batch.advantages["ep-0"].advantage == 1.0
    assert batch.advantages["ep-2"].advantage == 0.0 and not batch.advantages["ep-2"].valid


def test_infrastructure_failure_is_excluded_and_reported(small_model_dir):
    episodes, rows = group_of_four()
    # ep-1's child workflow was terminated: no rows file, not in the baseline.
    rows = [r for r in rows if r.episode_id != "ep-1"]
    records = [ok(episodes[0]), ok(episodes[2]), ok(episodes[3]),
               EpisodeRecord(episode_id="ep-1", group_id=GROUP, status="failed",
                             failure_kind="infrastructure", failure="child terminated")]  # fmt: skip
    out = episode_advantages(rows, records, std_scaling=False)
    # baseline rewards 1, 0, 0 (ep-0, ep-2, ep-3): mean 1/3
    assert out["ep-0"].advantage == pytest.approx(2 / 3) and out["ep-3"].advantage == pytest.approx(-1 / 3)
    assert not out["ep-1"].in_baseline and out["ep-1"].advantage == 0.0
    learner = Learner(small_model_dir, LearnerConfig(rollouts_per_step=4), device="cpu")
    metrics = learner.step(rows, records)
    assert (metrics.rollouts, metrics.baseline_rollouts, metrics.excluded_rollouts) == (4, 3, 1)
    assert (metrics.infrastructure_failed_rollouts, metrics.policy_failed_rollouts) == (1, 0)


def test_rows_must_agree_with_the_records():
    episodes, rows = group_of_four()
    records = [ok(e) for e in episodes]
    with pytest.raises(UnknownEpisodeError, match="'ep-0'"):
        episode_advantages(rows, records[1:])
    with pytest.raises(DuplicateEpisodeError, match="'ep-3'"):
        episode_advantages(rows, records + records[3:])
    wrong_reward = [records[0].model_copy(update={"reward": 2.0}), *records[1:]]
    with pytest.raises(EpisodeRowsMismatchError, match="reward"):
        episode_advantages(rows, wrong_reward)
    wrong_group = [records[0].model_copy(update={"group_id": "other"}), *records[1:]]
    with pytest.raises(EpisodeRowsMismatchError, match="group"):
        episode_advantages(rows, wrong_group)
    says_failed = [EpisodeRecord(episode_id="ep-0", group_id=GROUP, reward=1.0, status="failed",
                                 failure_kind="policy"), *records[1:]]  # fmt: skip
    with pytest.raises(EpisodeRowsMismatchError, match="status"):
        episode_advantages(rows, says_failed)
    n0 = sum(r.episode_id == "ep-0" for r in rows)
    counted = [records[0].model_copy(update={"num_rows": n0 + 1}), *records[1:]]
    with pytest.raises(EpisodeRowCountError, match="'ep-0'"):
        episode_advantages(rows, counted)


def test_a_failed_record_must_name_its_kind():
    with pytest.raises(ValueError, match="failure_kind"):
        EpisodeRecord(episode_id="e", group_id="g", status="failed")
