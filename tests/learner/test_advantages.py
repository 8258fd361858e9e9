"""GRPO advantages over episodes: hand-computed values and the stated edge-case rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.advantages import (
    EpisodeRowsMismatchError,
    NonFiniteRewardError,
    episode_advantages,
    group_advantages,
)
from trainer.rows import Row


def row(episode: str, group: str, reward: float, *, n: int = 0, valid: bool = True) -> Row:
    z = np.zeros(4)
    return Row(f"{episode}#{n}", episode, group, z.astype(np.int32), z.astype(bool), z.astype(np.float32),
               reward=reward, valid=valid)  # fmt: skip


def adv(rows, **kw) -> dict[str, float]:
    return {e: a.advantage for e, a in episode_advantages(rows, **kw).items()}


def test_mean_only_rewards_one_and_two_give_minus_and_plus_half():
    out = group_advantages(np.array([1.0, 2.0]), np.array([True, True]), std_scaling=False, eps=1e-6)
    assert list(out) == [-0.5, 0.5]


def test_std_scaling_uses_sample_std():
    # rewards 0, 1, 2: mean 1, sample std 1 -> (r - 1) / (1 + eps)
    out = group_advantages(np.array([0.0, 1.0, 2.0]), np.ones(3, bool), std_scaling=True, eps=1e-6)
    assert out == pytest.approx([-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)], rel=1e-12)


def test_an_episode_counts_once_however_many_rows_it_has():
    # e1 has three rows, e2 one: still a 2-episode group with mean 0.5 and sample std sqrt(0.5).
    rows = [row("e1", "g", 1.0, n=i) for i in range(3)] + [row("e2", "g", 0.0)]
    assert adv(rows, std_scaling=False) == {"e1": 0.5, "e2": -0.5}
    scaled = adv(rows, std_scaling=True, eps=0.0)
    assert scaled["e1"] == pytest.approx(0.5 / math.sqrt(0.5)) and scaled["e2"] == pytest.approx(
        -0.5 / math.sqrt(0.5)
    )


def test_invalid_episode_is_out_of_the_baseline_and_gets_zero():
    rows = [row("a", "g", 1.0), row("b", "g", 0.0), row("c", "g", 100.0, valid=False)]
    assert adv(rows, std_scaling=False) == {"a": 0.5, "b": -0.5, "c": 0.0}


def test_one_invalid_row_invalidates_its_episode():
    rows = [row("a", "g", 1.0), row("a", "g", 1.0, n=1, valid=False), row("b", "g", 0.0), row("c", "g", 2.0)]
    out = episode_advantages(rows, std_scaling=False)
    assert not out["a"].valid and out["a"].advantage == 0.0
    assert out["b"].advantage == -1.0 and out["c"].advantage == 1.0


def test_singleton_all_failed_and_all_equal_groups_are_zero_not_nan():
    rows = [
        row("solo", "g1", 5.0),
        row("f1", "g2", float("nan"), valid=False),
        row("f2", "g2", 0.0, valid=False),
        row("s1", "g3", 1.0),
        row("s2", "g3", 1.0),
    ]
    assert adv(rows) == {"solo": 0.0, "f1": 0.0, "f2": 0.0, "s1": 0.0, "s2": 0.0}


def test_rows_of_one_episode_must_agree_on_reward_and_group():
    with pytest.raises(EpisodeRowsMismatchError, match="episode 'e'"):
        episode_advantages([row("e", "g", 1.0), row("e", "g", 2.0, n=1)])
    with pytest.raises(EpisodeRowsMismatchError, match="group"):
        episode_advantages([row("e", "g", 1.0), row("e", "h", 1.0, n=1)])


def test_non_finite_reward_of_a_valid_episode_is_refused():
    with pytest.raises(NonFiniteRewardError, match="'e'"):
        episode_advantages([row("e", "g", float("inf")), row("f", "g", 0.0)])
