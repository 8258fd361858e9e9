"""Asynchronous GRPO in the learner: the staleness bound, the lag distribution, truncated IS.

- At lag 0 (every token sampled by the weights being updated: every token of a synchronous run) the
  learner's step is the loss without staleness: the same batch through the path that knows no version
  (`accumulate_gradients` without a version, i.e. no stale tokens known) gives identical loss and
  gradients, bit for bit.
- Stale tokens (sampled by an older version) are trained with a truncated IS weight against the
  learner's own distribution: when the behaviour logprobs are the learner's own, the weight is 1 and
  the gradient is the on-policy gradient; when they are far below, every weight is capped and the
  gradient is exactly `is_cap` times that one.
- The learner refuses tokens outside the run's bound, naming the call.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bench.forests import random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from trainer.learner import Learner, accumulate_gradients, prepare_batch, score_tokens
from trainer.loss import LossInputs, grpo_loss
from trainer.off_policy import PolicyLagError, check_policy_lag, lag_metrics, token_lags
from trainer.rows import Row

CFG = LearnerConfig(lr=1e-3, clip_low=0.2, clip_high=0.2)


def rows_at(version: int, seed: int = 11) -> list[Row]:
    """A random batch whose every call was sampled by policy `version`."""
    rows = [r for ep in random_batch(seed, vocab=512, groups=2, group_size=3) for r in rows_from_calls(ep)]
    return [
        dataclasses.replace(r, spans=tuple(dataclasses.replace(s, policy_version=version) for s in r.spans))
        for r in rows
    ]


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def batch_gradient(
    model_dir, rows: list[Row], *, version: int | None, is_cap: float = 2.0, behaviour=None
) -> tuple[float, list[torch.Tensor]]:
    """Loss and gradient of one logical batch, accumulated by the learner's own code."""
    learner = Learner(model_dir, CFG, device="cpu")
    batch = prepare_batch(rows, CFG, None)
    plan = batch.plan
    if behaviour is not None:
        plan = [dataclasses.replace(mb, behavior_logprobs=behaviour(learner, mb)) for mb in plan]
    learner.optimizer.zero_grad(set_to_none=True)
    total = accumulate_gradients(
        learner.model, plan, batch.denominator, CFG, learner.device, version=version, is_cap=is_cap
    )
    return total.loss, grads(learner.model)


def test_at_lag_zero_the_loss_and_gradient_are_the_synchronous_ones_exactly(small_model_dir):
    rows = rows_at(3)
    loss_before, grad_before = batch_gradient(small_model_dir, rows, version=None)  # pre-existing path
    loss_now, grad_now = batch_gradient(small_model_dir, rows, version=3)  # lag 0: the step's weights
    assert loss_now == loss_before
    assert len(grad_now) == len(grad_before) > 0
    assert all(torch.equal(a, b) for a, b in zip(grad_now, grad_before, strict=True))
    # and the learner's whole step takes that path: same loss as the pre-existing accumulation
    learner = Learner(small_model_dir, CFG, device="cpu")
    learner.step_count = 3
    assert learner.step(rows).loss == loss_before


def _own_logprobs(learner: Learner, mb) -> torch.Tensor:
    with torch.no_grad():
        return score_tokens(learner.model, mb, CFG, learner.device).float()


def _far_below(learner: Learner, mb) -> torch.Tensor:
    return _own_logprobs(learner, mb) - 5.0  # pi_learner / pi_behaviour = e^5 > any cap used here


def test_stale_tokens_with_the_learners_own_logprobs_get_the_on_policy_gradient(small_model_dir):
    fresh = rows_at(2)
    stale = rows_at(0)  # the same tokens, sampled two versions before the weights being updated
    _, on_policy = batch_gradient(small_model_dir, fresh, version=2, behaviour=_own_logprobs)
    _, corrected = batch_gradient(small_model_dir, stale, version=2, behaviour=_own_logprobs)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(corrected, on_policy, strict=True))


def test_stale_tokens_far_off_policy_are_capped_at_the_is_cap(small_model_dir):
    stale = rows_at(0)
    _, weight_one = batch_gradient(small_model_dir, stale, version=1, behaviour=_own_logprobs)
    _, capped = batch_gradient(small_model_dir, stale, version=1, is_cap=3.0, behaviour=_far_below)
    assert all(
        torch.allclose(c, 3.0 * w, rtol=1e-5, atol=1e-7) for c, w in zip(capped, weight_one, strict=True)
    )


def test_the_loss_reports_stale_and_truncated_tokens():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], requires_grad=True)
    inputs = LossInputs(
        logprobs=logp,
        behavior_logprobs=torch.tensor([-1.0, -4.0, -0.5, -3.1]),
        advantages=torch.tensor([1.0, -1.0, 0.5, 2.0]),
        ref_logprobs=None,
        denominator=4,
        stale=torch.tensor([False, True, False, True]),
    )
    out = grpo_loss(inputs, clip_low=0.2, clip_high=0.2, kl_coef=0.0, is_cap=2.0)
    # token 1: pi/mu = e^2 > 2: truncated; token 3: e^0.1 < 2: not
    assert (out.stale, out.is_truncated) == (2, 1)
    none_stale = dataclasses.replace(inputs, stale=torch.zeros(4, dtype=torch.bool))
    a = grpo_loss(none_stale, clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    b = grpo_loss(dataclasses.replace(inputs, stale=None), clip_low=0.2, clip_high=0.2, kl_coef=0.0)
    assert torch.equal(a.loss, b.loss) and (a.stale, b.stale) == (0, 0)


def test_the_staleness_bound_is_checked_and_measured():
    rows = rows_at(4)
    lags = token_lags(rows, 5)
    assert lags.size > 0 and set(lags.tolist()) == {1}
    check_policy_lag(rows, 5, 1)  # lag 1 allowed at max_policy_lag 1
    with pytest.raises(PolicyLagError, match=r"lag 1, allowed 0\.\.0"):
        check_policy_lag(rows, 5, 0)
    with pytest.raises(PolicyLagError, match=r"lag -1"):
        check_policy_lag(rows, 3, 2)  # sampled by a version newer than the weights: never valid
    mixed = rows_at(4)[:2] + rows_at(2)[2:]
    m = lag_metrics(mixed, 5)
    n1, n3 = token_lags(mixed[:2], 5).size, token_lags(mixed[2:], 5).size
    assert m["lag_tokens_1"] == n1 and m["lag_tokens_3"] == n3 and m["lag_max"] == 3
    assert m["lag_mean"] == pytest.approx((n1 + 3 * n3) / (n1 + n3))


def _with_behaviour(rows: list[Row], value: float) -> list[Row]:
    """The rows with the behaviour logprob of every loss token set to `value` (0 elsewhere)."""
    return [
        dataclasses.replace(r, behavior_logprobs=np.where(r.loss_mask, value, 0.0).astype(np.float32))
        for r in rows
    ]


def test_the_learner_step_reports_how_far_off_policy_its_stale_tokens_were(small_model_dir):
    # Behaviour logprob -50: pi_learner / pi_behaviour = e^(logp + 50) far above any cap, so every
    # stale token is truncated and weighs exactly the cap. Behaviour logprob 0 (probability 1): the
    # weight is the learner's own probability, in (0, 1), never truncated.
    for behaviour in (-50.0, 0.0):
        learner = Learner(small_model_dir, CFG, device="cpu")
        learner.step_count, learner.is_cap = 2, 3.0
        m = learner.step(_with_behaviour(rows_at(0), behaviour))  # every token sampled 2 versions back
        assert m.stale_tokens == m.loss_tokens > 0
        if behaviour < 0:
            assert (m.is_truncated_frac, m.is_weight_mean) == (1.0, pytest.approx(3.0))
        else:
            assert m.is_truncated_frac == 0.0 and 0.0 < m.is_weight_mean < 1.0
    # a synchronous step (every token sampled by the weights updated) has none
    learner = Learner(small_model_dir, CFG, device="cpu")
    learner.step_count = 2
    m = learner.step(_with_behaviour(rows_at(2), -50.0))
    assert (m.stale_tokens, m.is_truncated_frac, m.is_weight_mean) == (0, 0.0, 0.0)
