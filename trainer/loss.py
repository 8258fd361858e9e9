"""The GRPO objective on a flat list of loss tokens: PPO-clip surrogate + optional k3 KL (pure torch).

Per eligible action token i, with advantage A_i of the episode that owns it:

    ratio_i = exp(logp_i - behaviour_logp_i)
    pg_i    = -min(ratio_i * A_i, clip(ratio_i, 1 - clip_low, 1 + clip_high) * A_i)
    kl_i    = exp(ref_i - logp_i) - (ref_i - logp_i) - 1        (Schulman's k3 estimator of
                                                                  KL(policy || reference), >= 0)
    loss    = sum_i (pg_i + kl_coef * kl_i) / denominator

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


@dataclass(frozen=True)
class LossOutputs:
    loss: Tensor  # float32 [], this micro-batch's share of the batch loss (differentiable)
    pg_sum: float  # sum of pg_i over these tokens
    kl_sum: float  # sum of kl_i over these tokens (0 without a reference)
    ratio_sum: float  # sum of ratio_i, for the mean ratio
    clipped: int  # tokens whose clipped branch is active (they get no gradient from pg)
    tokens: int  # N


def _check(inputs: LossInputs) -> None:
    n = inputs.logprobs.shape
    named = {"behavior_logprobs": inputs.behavior_logprobs, "advantages": inputs.advantages}
    if inputs.ref_logprobs is not None:
        named["ref_logprobs"] = inputs.ref_logprobs
    for name, t in named.items():
        if t.shape != n:
            raise LossInputError(f"loss input {name} has shape {tuple(t.shape)}, logprobs {tuple(n)}")
    if inputs.denominator <= 0:
        raise LossInputError(
            f"loss denominator is {inputs.denominator}; it must be the (positive) number of unique "
            "eligible tokens of the logical batch"
        )


def grpo_loss(inputs: LossInputs, *, clip_low: float, clip_high: float, kl_coef: float) -> LossOutputs:
    """PPO-clip + k3 KL over N loss tokens, divided by the logical batch's unique-token count."""
    _check(inputs)
    ratio = torch.exp(inputs.logprobs - inputs.behavior_logprobs)  # [N]
    unclipped = ratio * inputs.advantages  # [N]
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * inputs.advantages  # [N]
    pg = -torch.minimum(unclipped, clipped)  # [N]
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
    )
