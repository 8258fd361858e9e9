"""The GRPO objective on a flat list of loss tokens: PPO-clip surrogate + optional k3 KL (pure torch).

Per eligible action token i, with advantage A_i of the episode that owns it:

    ratio_i = exp(logp_i - behaviour_logp_i)
    pg_i    = -min(ratio_i * A_i, clip(ratio_i, 1 - clip_low, 1 + clip_high) * A_i)
    kl_i    = exp(ref_i - logp_i) - (ref_i - logp_i) - 1        (Schulman's k3 estimator of
                                                                  KL(policy || reference), >= 0)
    loss    = sum_i (pg_i + kl_coef * kl_i) / denominator

Off-policy tokens (asynchronous GRPO, RunConfig.max_policy_lag > 0; docs/rollout-scale.md): a token
sampled by an older policy version than the weights this step updates (`stale_i`) is trained with
token-level truncated importance sampling against the learner's own current distribution, the
decoupled form of PPO (the proximal policy is the learner's weights before the update):

    prox_i  = sg(logp_i)                                    (the weights being updated, no gradient)
    w_i     = min(exp(prox_i - behaviour_logp_i), is_cap)   (truncated IS weight, no gradient)
    r_i     = exp(logp_i - prox_i)                          (= 1 in value; its gradient is d logp_i)
    pg_i    = -w_i * min(r_i * A_i, clip(r_i, 1 - clip_low, 1 + clip_high) * A_i)

Tokens sampled by the weights being updated (every token at max_policy_lag 0) keep the surrogate
above unchanged, so a batch without stale tokens gives exactly the loss it gave before.

`denominator` is the number of unique eligible action tokens of the whole *logical* batch, passed in
by the caller; a micro-batch's loss is therefore its exact share of the batch loss, and gradient
accumulation over micro-batches sums to the one-big-batch gradient. Token order is irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class LossInputError(ValueError):
    """Loss inputs with mismatched shapes or a non-positive denominator."""


@dataclass(frozen=True)
class LossInputs:
    logprobs: Tensor  # float32 [N], current policy, differentiable
    behavior_logprobs: Tensor  # float32 [N], recorded by the sampler
    advantages: Tensor  # float32 [N], the owner episode's advantage on each of its tokens
    ref_logprobs: Tensor | None  # float32 [N], frozen reference; None when kl_coef == 0
    denominator: int  # unique eligible tokens of the logical batch (not of this micro-batch)
    # bool [N]: sampled by an older policy version than the weights being updated; None: none is
    stale: Tensor | None = None


@dataclass(frozen=True)
class LossOutputs:
    loss: Tensor  # float32 [], this micro-batch's share of the batch loss (differentiable)
    pg_sum: float  # sum of pg_i over these tokens
    kl_sum: float  # sum of kl_i over these tokens (0 without a reference)
    ratio_sum: float  # sum of ratio_i, for the mean ratio
    clipped: int  # tokens whose clipped branch is active (they get no gradient from pg)
    tokens: int  # N
    stale: int = 0  # tokens trained with truncated IS (sampled by an older version)
    is_truncated: int = 0  # of which: IS weight capped at is_cap
    is_weight_sum: float = 0.0  # sum of w_i over the stale tokens


def _check(inputs: LossInputs) -> None:
    n = inputs.logprobs.shape
    named = {"behavior_logprobs": inputs.behavior_logprobs, "advantages": inputs.advantages}
    if inputs.ref_logprobs is not None:
        named["ref_logprobs"] = inputs.ref_logprobs
    if inputs.stale is not None:
        named["stale"] = inputs.stale
    for name, t in named.items():
        if t.shape != n:
            raise LossInputError(f"loss input {name} has shape {tuple(t.shape)}, logprobs {tuple(n)}")
    if inputs.denominator <= 0:
        raise LossInputError(
            f"loss denominator is {inputs.denominator}; it must be the (positive) number of unique "
            "eligible tokens of the logical batch"
        )


def _stale_surrogate(
    inputs: LossInputs, clip_low: float, clip_high: float, is_cap: float
) -> tuple[Tensor, Tensor]:
    """pg_i of the truncated-IS (decoupled) objective for every token, and the IS weights w_i: [N]."""
    prox = inputs.logprobs.detach()
    weight = torch.exp(prox - inputs.behavior_logprobs).clamp(max=is_cap)  # [N], no gradient
    r = torch.exp(inputs.logprobs - prox)  # [N], 1 in value
    surrogate = torch.minimum(
        r * inputs.advantages, r.clamp(1.0 - clip_low, 1.0 + clip_high) * inputs.advantages
    )
    return -weight * surrogate, weight


def grpo_loss(
    inputs: LossInputs, *, clip_low: float, clip_high: float, kl_coef: float, is_cap: float = 2.0
) -> LossOutputs:
    """PPO-clip + k3 KL over N loss tokens, divided by the logical batch's unique-token count;
    truncated IS for stale tokens (module docstring)."""
    _check(inputs)
    if is_cap < 1.0:
        raise LossInputError(f"is_cap is {is_cap}; the truncated IS cap must be >= 1")
    ratio = torch.exp(inputs.logprobs - inputs.behavior_logprobs)  # [N]
    unclipped = ratio * inputs.advantages  # [N]
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * inputs.advantages  # [N]
    pg = -torch.minimum(unclipped, clipped)  # [N]
    stale_info = (0, 0, 0.0)
    if inputs.stale is not None and bool(inputs.stale.any()):
        stale = inputs.stale.to(torch.bool)
        pg_stale, weight = _stale_surrogate(inputs, clip_low, clip_high, is_cap)
        pg = torch.where(stale, pg_stale, pg)
        clipped = torch.where(stale, unclipped, clipped)  # the behaviour-ratio clip does not apply to them
        w = weight.detach()[stale]
        stale_info = (int(stale.sum()), int((w >= is_cap).sum()), float(w.sum()))
    per_token = pg
    kl_sum = 0.0
    if kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise LossInputError("kl_coef > 0 needs ref_logprobs from the frozen reference model")
        log_r = inputs.ref_logprobs - inputs.logprobs  # [N]
        kl = torch.exp(log_r) - log_r - 1.0  # [N]
        per_token = pg + kl_coef * kl
        kl_sum = float(kl.detach().sum())
    loss = per_token.sum() / inputs.denominator
    return LossOutputs(
        loss=loss,
        pg_sum=float(pg.detach().sum()),
        kl_sum=kl_sum,
        ratio_sum=float(ratio.detach().sum()),
        clipped=int((clipped < unclipped).sum()),
        tokens=int(ratio.shape[0]),
        stale=stale_info[0],
        is_truncated=stale_info[1],
        is_weight_sum=stale_info[2],
    )
