"""LearnerConfig: the LR schedule counts logical rollouts; the fingerprint names every field."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from grove.learner_config import LearnerConfig


def test_warmup_then_cosine_in_rollouts():
    cfg = LearnerConfig(
        lr=1.0, lr_schedule="cosine", warmup_rollouts=10, total_rollouts=110, min_lr_ratio=0.1
    )
    assert cfg.lr_at(5) == pytest.approx(0.5)  # half-way through warmup
    assert cfg.lr_at(10) == pytest.approx(1.0)
    assert cfg.lr_at(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay: cos = 0
    assert cfg.lr_at(110) == pytest.approx(0.1)
    assert cfg.lr_at(500) == pytest.approx(0.1)  # held at the floor


def test_linear_decay_in_rollouts():
    cfg = LearnerConfig(lr=2.0, lr_schedule="linear", total_rollouts=40)
    assert [cfg.lr_at(n) for n in (0, 10, 40)] == pytest.approx([2.0, 1.5, 0.0])


def test_constant_schedule_ignores_total():
    assert LearnerConfig(lr=3e-4).lr_at(10**6) == 3e-4


def test_decaying_schedule_needs_total_rollouts():
    with pytest.raises(ValidationError, match="total_rollouts"):
        LearnerConfig(lr_schedule="cosine")


def test_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="extra"):
        LearnerConfig(learning_rate=1e-5)


def test_fingerprint_changes_with_any_field_and_is_stable():
    base = LearnerConfig()
    assert base.fingerprint() == LearnerConfig().fingerprint()
    assert len(base.fingerprint()) == 64
    for change in ({"lr": 2e-6}, {"clip_high": 0.28}, {"micro_batch_tokens": 4096}, {"seed": 1}):
        assert LearnerConfig(**change).fingerprint() != base.fingerprint(), change
    assert not math.isnan(base.lr_at(0))


def test_rank_count_is_not_fingerprinted_so_checkpoints_resume_onto_any_count():
    # where a step runs, not what it computes (tests/learner/test_train_ranks.py resumes 2 -> 3 -> 1)
    assert LearnerConfig(ranks=4).fingerprint() == LearnerConfig().fingerprint()
    assert LearnerConfig(ranks=4, lr=2e-6).fingerprint() == LearnerConfig(lr=2e-6).fingerprint()
    with pytest.raises(ValueError, match="ranks"):
        LearnerConfig(ranks=0)
    with pytest.raises(ValueError, match="ranks=2 with kl_coef=0.1"):  # no reference model on ranks yet
        LearnerConfig(ranks=2, kl_coef=0.1)
