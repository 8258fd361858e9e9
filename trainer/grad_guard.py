"""Every micro-batch's gradient is checked before the optimizer step: non-finite or implausible -> refused.

A learner pass (one micro-batch's forward and backward) computes its own gradient g_k apart from the
gradient accumulated so far (`separate_pass_gradient`: the accumulated `.grad` is set aside during
the backward and g_k added to it after, one extra gradient-sized buffer while a pass runs). The
guard reads ||g_k|| (one fused norm; global over FSDP shards) and the pass's *loss weight*
w_k = sum_i |d loss_k / d logp_i| over its scored tokens (read exactly from the logprobs' gradient),
and refuses the step — typed error, gradients dropped, weights, optimizer state and counters
untouched — when:

- **non-finite** (`NonFiniteError`): the pass's loss or ||g_k|| is NaN or infinite. The error names
  the micro-batch, its rows and the parameter tensors whose gradient is not finite.
- **implausible** (`ImplausibleGradientError`): the pass's gradient per unit of loss weight,
  s_k = ||g_k|| / w_k, is more than `IMPLAUSIBLE_FACTOR` (1000) times the reference scale.

Why s = ||g|| / w. The gradient is g = sum_i c_i grad(logp_i) with c_i = d loss / d logp_i, so
s <= max_i ||grad(logp_i)||: s is bounded by the size of one token's score gradient, a property of
the weights and the data, not of the advantages' size, the loss denominator, the micro-batch split or
the number of tokens (those scale g and w alike). It is smaller when the tokens' gradients cancel
(s falls like 1 / sqrt(tokens) for unrelated directions), so between a micro-batch of a few tokens
and one of 32k, healthy values differ by ~sqrt(32k / few) ~ 100x at most; training moves the weights
slowly. A broken attention kernel is off by orders of magnitude more (the cuDNN case of
trainer/attention_backend.py, at an unchanged loss weight). 1000x sits between.

The reference scale is the median of `history` (s of the last `HISTORY` accepted passes, kept across
steps and in the checkpoint) and of this step's earlier passes. A learner with no history (the first
step of a run, or a checkpoint written before the guard existed) first measures one probe: the
shortest trained row with a non-zero advantage, padded layout, float32, SDPA's MATH kernel and full
logits (the reference computations), its gradient dropped after the measurement. So even the first
micro-batch of a run is compared with a trusted number. A pass with no loss weight (every token
clipped, advantage 0, or a rank's zero-weighted padding pass) has no scale: only finiteness is checked.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

IMPLAUSIBLE_FACTOR = 1000.0  # s_k / reference above this: refused (module docstring says why)
HISTORY = 64  # accepted passes whose scales form the reference


class NonFiniteError(FloatingPointError):
    """The loss or the gradient of a micro-batch is NaN or infinite; the optimizer step was not taken."""


class ImplausibleGradientError(FloatingPointError):
    """A micro-batch's gradient per unit of loss weight is far above the learner's reference scale; the
    optimizer step was not taken."""


def finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def grad_norm(parameters: Iterable[nn.Parameter]) -> float:
    """Global L2 norm of the parameters' gradients (FSDP: over every shard; a collective there)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if hasattr(norm, "full_tensor"):  # DTensor (FSDP2): reduce over the ranks
        norm = norm.full_tensor()
    return float(norm)


def non_finite_parameters(model: nn.Module, limit: int = 5) -> list[str]:
    """Names of up to `limit` parameters whose gradient holds NaN or inf (this rank's shard)."""
    out = []
    for name, p in model.named_parameters():
        if p.grad is not None:
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            if not bool(torch.isfinite(local).all()):
                out.append(name)
                if len(out) == limit:
                    break
    return out


@contextmanager
def separate_pass_gradient(params: Sequence[nn.Parameter]) -> Iterator[None]:
    """Inside: `.grad` holds only this pass's gradient. After: the gradient accumulated before, plus it."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, before in zip(params, saved, strict=True):
            if before is None:
                continue
            if p.grad is not None:
                before.add_(p.grad)  # what autograd's accumulation would have done
            p.grad = before


@dataclass(frozen=True)
class PassCheck:
    """What one pass did to the accumulated gradient."""

    index: int  # pass number in the step (0-based)
    passes: int  # passes of the step
    rows: Sequence[str]  # row ids of the pass's micro-batch (this rank's)
    tokens: int  # scored tokens of the pass (all ranks)
    loss: float  # the pass's loss share (all ranks)
    loss_weight: float  # sum |d loss / d logp_i| (all ranks); 0: no scale
    grad_norm: float  # ||g_k||, the pass's own gradient (all ranks)

    @property
    def scale(self) -> float | None:
        return self.grad_norm / self.loss_weight if self.loss_weight > 0 else None

    def describe(self) -> str:
        shown = ", ".join(repr(r) for r in list(self.rows)[:3]) + (" ..." if len(self.rows) > 3 else "")
        return f"micro-batch {self.index + 1} of {self.passes} ({self.tokens} scored tokens, rows {shown})"


class GradientGuard:
    """Per-pass checks of one learner; `history` survives steps (and checkpoints)."""

    def __init__(self, history: Iterable[float] = ()) -> None:
        self.history: deque[float] = deque(history, maxlen=HISTORY)
        self._step: list[float] = []

    def begin_step(self) -> None:
        self._step = []

    def needs_probe(self) -> bool:
        return not self.history and not self._step

    def calibrate(self, scale: float) -> None:
        """Seed this step's reference with a probe's scale (measured on the reference computations);
        like the passes' scales it joins the history only if the step is taken."""
        if scale > 0 and finite(scale):
            self._step.append(scale)

    def reference(self) -> float | None:
        values = [*self.history, *self._step]
        return statistics.median(values) if values else None

    def check(self, p: PassCheck, step: int, bad_parameters: list[str]) -> None:
        """Raise if the pass's gradient is non-finite or implausible; else remember its scale."""
        if not finite(p.loss, p.grad_norm):
            raise NonFiniteError(
                f"step {step}: {p.describe()} gave loss {p.loss} and gradient norm {p.grad_norm} "
                f"(non-finite gradients in {bad_parameters or 'no local parameter'}); the optimizer step "
                "was not taken and the weights are unchanged. Look for -inf logprobs (a sampled token "
                "outside the current top-p set with kl_coef > 0), corrupt behaviour logprobs, or an "
                "attention kernel that returns NaN (trainer/attention_backend.py says which run)"
            )
        scale, ref = p.scale, self.reference()
        if scale is None:
            return
        if ref is not None and scale > IMPLAUSIBLE_FACTOR * ref:
            raise ImplausibleGradientError(
                f"step {step}: {p.describe()} has a gradient norm of {p.grad_norm:.4g} "
                f"for a loss weight of {p.loss_weight:.4g}: {scale:.4g} per unit, {scale / ref:.3g}x the "
                f"reference {ref:.4g} (limit {IMPLAUSIBLE_FACTOR:g}x; trainer/grad_guard.py); the optimizer "
                "step was not taken and the weights are unchanged. A broken attention kernel gives this "
                "(compare the step on another backend); a genuine jump this large means corrupt inputs"
            )
        self._step.append(scale)

    def commit(self) -> None:
        """The step was taken: its passes join the history."""
        self.history.extend(self._step)
        self._step = []
