"""Every micro-batch's gradient is checked before the optimizer step: non-finite or implausible -> refused.

A learner pass (one micro-batch's forward and backward) computes its own gradient g_k apart from the
gradient accumulated so far (`separate_pass_gradient`: the accumulated `.grad` is set aside during
the backward and g_k added to it after, one extra gradient-sized buffer while a pass runs). The
guard reads ||g_k|| (one fused norm; global over FSDP shards) and the pass's *loss weight*
w_k = sum_i |d loss_k / d logp_i| / T_i over its scored tokens (read exactly from the logprobs'
gradient; T_i the token's sampling temperature), and refuses the pass — typed `GradientRefusal`
carrying its evidence, gradients dropped, weights, optimizer state and counters untouched — when:

- **non-finite** (`NonFiniteError`): the pass's loss or ||g_k|| is NaN or infinite. The error names
  the micro-batch, its rows and the parameter tensors whose gradient is not finite.
- **implausible** (`ImplausibleGradientError`): the pass's gradient per unit of loss weight,
  s_k = ||g_k|| / w_k, is more than `IMPLAUSIBLE_FACTOR` (1000) times the learner's anchor.

Why s = ||g|| / w, with w divided by T. The gradient is g = sum_i c_i grad(logp_i), c_i = d loss / d
logp_i, and grad(logp_i) = (onehot - softmax_i) J_i / T_i with J_i the logits' Jacobian: s is at most
max_i ||(onehot - softmax_i) J_i|| (||onehot - softmax|| <= sqrt 2), a property of the weights and the
input, not of the temperature, the advantages' size, the loss denominator, the micro-batch split or
the number of tokens (those scale g and w alike). It is smaller when the softmax saturates (a
confident token at a low temperature: onehot - softmax ~ 0, exactly 0 in float at T = 0.01) and when
the tokens' gradients cancel (like 1 / sqrt(tokens) for unrelated directions): healthy scales range
down to 0 but not up. A pass whose s or ||g|| is 0 moves nothing and has no scale (checked for
finiteness only), as has a pass with no loss weight (every token clipped, advantage 0, or a rank's
zero-weighted padding pass).

The anchor: an upper, temperature-free reference, measured once per run (the first step, or the
first after a checkpoint without one) by a probe on the reference computations (padded layout,
float32, SDPA's MATH kernel, full logits): the shortest trained row, scored at temperature
`PROBE_TEMPERATURE` (softmax ~ uniform: never saturated) and top_p 1, loss T / m * sum of the
logprobs of its first m = `PROBE_TOKENS` tokens (loss weight 1, little cancellation); its gradient is
dropped. Healthy passes sit at or below it (tests: real rows at T = 0.01 .. 2 over many steps); a
broken attention kernel is off by orders of magnitude more (the cuDNN case of
trainer/attention_backend.py); 1000x sits between. The anchor never follows the passes, so a
gradient that grows a little every step (1.25x per step) is refused once it is 1000x the run's
start. It is checkpointed (`TrainerState.gradient_anchor`); `history` keeps the last `HISTORY`
accepted scales as evidence for the refusal message and metrics only.

A refusal is the step's failure, never a transient one: activities/training.py raises it as a
non-retryable `ApplicationError` named after the error class, with `evidence` (which pass, its rows,
norms, scale, anchor) in its details and in the store (`guard_refusal_key`). The operator's setting
`LearnerConfig.guard_refusal` chooses what a refusal does: "fail" (default: the run stops there),
"skip" (the refused step takes no optimizer update, its counters advance, the run goes on; metric
`guard_refused` = 1) or "accept" (an implausible — finite — pass is trained as computed, metric
`guard_refused` = 1; a non-finite one is still skipped: it would destroy the weights).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

IMPLAUSIBLE_FACTOR = 1000.0  # s_k / anchor above this: refused (module docstring says why)
HISTORY = 64  # accepted passes kept as evidence
PROBE_TEMPERATURE = 1000.0  # the anchor's probe: softmax ~ uniform, never saturated
PROBE_TOKENS = 16  # the anchor's probe loss: the first tokens of its row (little cancellation)


class GradientRefusal(FloatingPointError):
    """The guard refused a pass of an optimizer step, which was not taken; `evidence` says which pass,
    its rows and its norms (JSON-ready)."""

    def __init__(self, message: str, evidence: dict[str, Any]) -> None:
        super().__init__(message)
        self.evidence = evidence


class NonFiniteError(GradientRefusal):
    """The loss or the gradient of a micro-batch is NaN or infinite; the optimizer step was not taken."""


class ImplausibleGradientError(GradientRefusal):
    """A micro-batch's gradient per unit of loss weight is far above the learner's anchor; the
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
    loss_weight: float  # sum |d loss / d logp_i| / T_i (all ranks); 0: no scale
    grad_norm: float  # ||g_k||, the pass's own gradient (all ranks)

    @property
    def scale(self) -> float | None:
        """||g|| / w; None when either is 0 (nothing to compare: the pass moves nothing)."""
        return self.grad_norm / self.loss_weight if self.loss_weight > 0 and self.grad_norm > 0 else None

    def describe(self) -> str:
        shown = ", ".join(repr(r) for r in list(self.rows)[:3]) + (" ..." if len(self.rows) > 3 else "")
        return f"micro-batch {self.index + 1} of {self.passes} ({self.tokens} scored tokens, rows {shown})"

    def evidence(self, kind: str, step: int, anchor: float | None, **extra: Any) -> dict[str, Any]:
        scale = self.scale
        return {
            "kind": kind, "step": step, "pass": self.index + 1, "passes": self.passes,
            "rows": list(self.rows), "tokens": self.tokens, "loss": self.loss,
            "loss_weight": self.loss_weight, "grad_norm": self.grad_norm, "scale": scale,
            "anchor": anchor, "ratio": scale / anchor if scale is not None and anchor else None,
            "limit": IMPLAUSIBLE_FACTOR, **extra,
        }  # fmt: skip


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


class GradientGuard:
    """Per-pass checks of one learner; `anchor` and `history` survive steps (and checkpoints)."""

    def __init__(self, anchor: float | None = None, history: Iterable[float] = ()) -> None:
        self.anchor = anchor
        self.history: deque[float] = deque(history, maxlen=HISTORY)
        self.accept_implausible = False  # LearnerConfig.guard_refusal == "accept"
        self.accepted: dict[str, Any] | None = None  # this step's accepted refusal (evidence)
        self._step: list[float] = []
        self._anchor: float | None = None  # this step's probe, kept if the step is taken

    def begin_step(self, accept_implausible: bool = False) -> None:
        self._step, self._anchor, self.accepted = [], None, None
        self.accept_implausible = accept_implausible

    def needs_probe(self) -> bool:
        return self.anchor is None and self._anchor is None

    def calibrate(self, scale: float) -> None:
        """The probe's scale (module docstring) becomes the anchor, from this step on if it is taken."""
        if scale > 0 and finite(scale):
            self._anchor = scale

    def reference(self) -> float | None:
        return self.anchor if self.anchor is not None else self._anchor

    def check(self, p: PassCheck, step: int, bad_parameters: list[str]) -> None:
        """Raise if the pass's gradient is non-finite or implausible; else remember its scale."""
        if not finite(p.loss, p.grad_norm):
            evidence = p.evidence("non-finite", step, self.reference(), bad_parameters=bad_parameters)
            evidence.update(loss=_json_float(p.loss), grad_norm=_json_float(p.grad_norm))
            raise NonFiniteError(
                f"step {step}: {p.describe()} gave loss {p.loss} and gradient norm {p.grad_norm} "
                f"(non-finite gradients in {bad_parameters or 'no local parameter'}); the optimizer step "
                "was not taken and the weights are unchanged. Look for -inf logprobs (a sampled token "
                "outside the current top-p set with kl_coef > 0), corrupt behaviour logprobs, or an "
                "attention kernel that returns NaN (trainer/attention_backend.py says which run)",
                evidence,
            )
        scale, ref = p.scale, self.reference()
        if scale is None:
            return
        if ref is not None and scale > IMPLAUSIBLE_FACTOR * ref:
            evidence = p.evidence("implausible", step, ref, recent_scales=list(self.history)[-8:])
            if self.accept_implausible:
                self.accepted = evidence  # the operator accepts it (LearnerConfig.guard_refusal)
                return
            raise ImplausibleGradientError(
                f"step {step}: {p.describe()} has a gradient norm of {p.grad_norm:.4g} "
                f"for a loss weight of {p.loss_weight:.4g}: {scale:.4g} per unit, {scale / ref:.3g}x the "
                f"anchor {ref:.4g} (limit {IMPLAUSIBLE_FACTOR:g}x; trainer/grad_guard.py); the optimizer "
                "step was not taken and the weights are unchanged. A broken attention kernel gives this "
                "(compare the step on another backend); a genuine jump this large means corrupt inputs. "
                "LearnerConfig.guard_refusal='skip' or 'accept' lets a run go on (docs/learner.md)",
                evidence,
            )
        self._step.append(scale)

    def commit(self) -> None:
        """The step was taken: its passes join the history, its probe (if any) becomes the anchor."""
        self.history.extend(self._step)
        if self.anchor is None:
            self.anchor = self._anchor
        self._step, self._anchor = [], None

    def worst_ratio(self) -> float:
        """The largest scale / anchor of this step's accepted passes (a metric); 0 without either."""
        ref = self.reference()
        return max(self._step, default=0.0) / ref if ref else 0.0
