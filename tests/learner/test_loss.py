"""The PPO-clip + k3 loss on hand-computed tokens, including which tokens get gradient."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import LossInputError, LossInputs, grpo_loss


def inputs(ref=None, denominator=4):
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    return LossInputs(
        logprobs=logp,
        behavior_logprobs=torch.tensor([-1.0, -2.5, -0.2], dtype=torch.float64),
        advantages=torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64),
        ref_logprobs=ref,
        denominator=denominator,
    )


def test_clip_values_and_gradients_by_hand():
    x = inputs()
    out = grpo_loss(x, clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    # token 0: ratio 1 -> -1; token 1: ratio e^0.5 clipped to 1.2 -> -1.2;
    # token 2: ratio e^-0.3 = 0.741 < 0.8 with A = -2: min(-1.482, -1.6) = -1.6 -> +1.6
    assert out.loss.item() == pytest.approx((-1.0 - 1.2 + 1.6) / 4, rel=1e-12)
    assert out.clipped == 2 and out.tokens == 3
    assert out.ratio_sum == pytest.approx(1 + math.exp(0.5) + math.exp(-0.3), rel=1e-12)
    out.loss.backward()
    # d/dlogp of -ratio*A is -ratio*A for the unclipped token; clipped tokens get no gradient
    assert x.logprobs.grad.tolist() == pytest.approx([-0.25, 0.0, 0.0], abs=1e-15)


def test_asymmetric_clip_high_lets_the_ratio_rise_further():
    out = grpo_loss(inputs(), clip_low=0.2, clip_high=0.7, kl_coef=0.0)
    # token 1 now unclipped: ratio e^0.5 = 1.6487 < 1.7
    assert out.loss.item() == pytest.approx((-1.0 - math.exp(0.5) + 1.6) / 4, rel=1e-12)
    assert out.clipped == 1


def test_k3_kl_term_by_hand():
    ref = torch.tensor([-1.5, -2.0, -0.5], dtype=torch.float64)
    out = grpo_loss(inputs(ref), clip_low=0.2, clip_high=0.2, kl_coef=0.1)
    k3 = math.exp(-0.5) + 0.5 - 1  # log r = ref - logp = -0.5 on token 0, 0 elsewhere
    assert out.kl_sum == pytest.approx(k3, rel=1e-12)
    assert out.loss.item() == pytest.approx((-0.6 + 0.1 * k3) / 4, rel=1e-12)


def test_denominator_is_the_callers_not_the_token_count():
    a = grpo_loss(inputs(denominator=3), clip_low=0.2, clip_high=0.2, kl_coef=0.0).loss.item()
    b = grpo_loss(inputs(denominator=30), clip_low=0.2, clip_high=0.2, kl_coef=0.0).loss.item()
    assert a == pytest.approx(10 * b, rel=1e-12)


def test_bad_inputs_are_named():
    with pytest.raises(LossInputError, match="denominator"):
        grpo_loss(inputs(denominator=0), clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    with pytest.raises(LossInputError, match="ref_logprobs"):
        grpo_loss(inputs(), clip_low=0.2, clip_high=0.2, kl_coef=0.1)
    bad = inputs()
    bad = LossInputs(bad.logprobs, bad.behavior_logprobs[:2], bad.advantages, None, 4)
    with pytest.raises(LossInputError, match="behavior_logprobs"):
        grpo_loss(bad, clip_low=0.2, clip_high=0.2, kl_coef=0.0)
