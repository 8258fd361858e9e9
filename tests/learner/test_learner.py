"""Learner.step: counters and the LR schedule count logical rollouts; the stated refusals and rules."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.forests import random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from trainer.learner import Learner, ReferenceModelError, RolloutCountError


def rows_of(seed: int, vocab: int, **kw):
    return [r for ep in random_batch(seed, vocab=vocab, **kw) for r in rows_from_calls(ep)]


def test_step_counts_rollouts_not_rows_and_follows_the_schedule(small_model_dir):
    cfg = LearnerConfig(lr=1e-3, lr_schedule="linear", warmup_rollouts=6, total_rollouts=18)
    learner = Learner(small_model_dir, cfg, device="cpu")
    rows = rows_of(1, 512, groups=2, group_size=3)
    assert len(rows) > 6  # more rows than rollouts
    first = learner.step(rows)
    assert (first.step, first.rollouts, first.rollouts_consumed) == (1, 6, 6)
    assert first.lr == pytest.approx(1e-3)  # end of warmup: 6 of 6 rollouts
    second = learner.step(rows_of(2, 512, groups=2, group_size=3))
    assert (second.step, second.rollouts_consumed) == (2, 12)
    assert second.lr == pytest.approx(1e-3 * 0.5)  # linear decay: 6 of 12 rollouts after warmup
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_incomplete_batch_never_completes_a_step(small_model_dir):
    learner = Learner(small_model_dir, LearnerConfig(rollouts_per_step=6), device="cpu")
    rows = rows_of(3, 512, groups=2, group_size=3)
    short = [r for r in rows if r.episode_id != rows[0].episode_id]
    before = [p.clone() for p in learner.model.parameters()]
    with pytest.raises(RolloutCountError, match="5 logical rollouts"):
        learner.step(short)
    assert learner.step_count == 0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(), strict=True))


def test_all_failed_batch_advances_counters_without_touching_weights(small_model_dir):
    learner = Learner(small_model_dir, LearnerConfig(lr=1e-2), device="cpu")
    rows = [dataclasses.replace(r, valid=False) for r in rows_of(4, 512, groups=1, group_size=2)]
    before = [p.clone() for p in learner.model.parameters()]
    metrics = learner.step(rows)
    assert metrics.skipped and metrics.loss_tokens == 0 and metrics.step == 1 and metrics.rollouts == 2
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(), strict=True))


def test_kl_without_reference_is_refused(small_model_dir):
    with pytest.raises(ReferenceModelError, match="reference_dir"):
        Learner(small_model_dir, LearnerConfig(kl_coef=0.1), device="cpu")


def test_kl_step_with_reference_runs_and_reports_kl(small_model_dir):
    learner = Learner(small_model_dir, LearnerConfig(lr=1e-2, kl_coef=0.1), device="cpu",
                      reference_dir=small_model_dir)  # fmt: skip
    rows = rows_of(5, 512, groups=1, group_size=2)
    assert learner.step(rows).kl == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert learner.step(rows).kl > 0  # the policy moved away from the frozen reference
