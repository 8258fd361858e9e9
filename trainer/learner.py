"""The GRPO learner: one optimizer step of the shared policy on the rows of one logical batch.

Which GRPO this is (docs/design.md, "7. GRPO and the failure rule"):
- Logical-owner advantages (trainer/advantages.py): one reward and one advantage per episode,
  baseline over the group's episode records (grove/episodes.py: every episode of the step, with
  0, 1 or many rows; policy failures count with `failure_reward`, infrastructure failures are
  excluded and counted in the metrics), fanned out to every eligible token the episode owns.
- Token-level PPO-clip with ratio exp(logp - behaviour logp), optional k3 KL to a frozen reference
  (trainer/loss.py), normalised by the unique eligible tokens of the logical batch (DAPO-style
  token-level normalisation; the row cut never changes an action's weight).
- Logprobs are sampler-processed (temperature, top-p) like vLLM's processed_logprobs
  (trainer/logprobs.py), each token under the processing of the span (call) it belongs to, as
  recorded in its receipt when it was sampled (rows.py span temperature/top_p, per-token arrays of
  the micro-batch). There is no run-wide learner temperature: calls of one episode may sample at
  different temperatures (gateway overrides) and each is scored as it was sampled, so the ratio is
  1 on-policy for every token.
- Dropout is off (eval mode): behaviour logprobs were sampled without it.
- Step counter, policy version and LR schedule count optimizer steps and logical rollouts (episode
  records), never rows; `rollouts_per_step` counts episode records.
- CPU: float32 everywhere. CUDA: bf16 autocast for the forward, float32 master weights, fused AdamW.
  The forward of a micro-batch is trainer/scoring.py (attention backend per device, chunked LM head).
- Every micro-batch's gradient is checked before the optimizer step (trainer/grad_guard.py): a NaN
  or an implausibly large one refuses the step with the weights and optimizer state untouched.
- One step body (`accumulate_gradients`) serves this learner and trainer/distributed.py's.

Usage:
    learner = Learner(model_dir, LearnerConfig(...))
    metrics = learner.step(rows, episodes)   # one optimizer step; learner.step_count += 1
  `episodes`: one grove.episodes.EpisodeRecord per episode of the step (rows-only if omitted,
  which cannot see episodes that produced no rows).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from grove.episodes import FAILURE_KINDS, EpisodeRecord
from grove.learner_config import LearnerConfig
from trainer.advantages import EpisodeAdvantage, episode_advantages
from trainer.attention import SEGMENT_ATTENTION
from trainer.attention_backend import AttentionBackend, choose_backend
from trainer.batch import MicroBatch, plan_micro_batches, trained_rows, unique_eligible_tokens, validate_rows
from trainer.chunked_logprobs import plain_head
from trainer.grad_guard import (
    PROBE_TEMPERATURE,
    PROBE_TOKENS,
    GradientGuard,
    GradientRefusal,
    ImplausibleGradientError,
    NonFiniteError,
    PassCheck,
    finite,
    grad_norm,
    non_finite_parameters,
    separate_pass_gradient,
)
from trainer.loss import LossInputs, LossOutputs, grpo_loss
from trainer.memory import enable_activation_checkpointing, token_budget
from trainer.off_policy import stale_mask
from trainer.packing import plan_packed_micro_batches, unique_prefix_tokens
from trainer.rows import Row
from trainer.scoring import forward_kwargs, pass_kernels, score_tokens

# re-exported for callers
__all__ = ["GradientRefusal", "ImplausibleGradientError", "NonFiniteError", "score_tokens"]


class RolloutCountError(ValueError):
    """The batch does not hold the configured number of logical rollouts."""


class ReferenceModelError(ValueError):
    """kl_coef > 0 without a reference model folder."""


class StepMetrics(BaseModel):
    """What one optimizer step did (logged, returned by the trainer activity)."""

    step: int  # optimizer steps taken so far, this one included (= policy version of the new weights)
    rollouts: int  # logical rollouts (episode records) in this batch, failed and zero-row ones included
    rollouts_consumed: int  # over the run, this batch included (the LR schedule's clock)
    valid_rollouts: int  # ok episodes (their rows train)
    baseline_rollouts: int = 0  # counted in a group baseline: ok + policy failures
    excluded_rollouts: int = 0  # left out of every baseline: infrastructure failures
    policy_failed_rollouts: int = 0  # failed by the policy's behaviour, in the baseline at failure_reward
    infrastructure_failed_rollouts: int = 0
    rowless_rollouts: int = 0  # episodes with no row in the batch (e.g. ok with only auxiliary calls)
    rows: int
    micro_batches: int
    loss_tokens: int  # unique eligible tokens of the logical batch: the loss denominator
    forwarded_tokens: int  # tokens forwarded, padding excluded (a tree forwards a shared prefix once)
    padded_tokens: int  # tensor positions forwarded, padding included
    row_tokens: int  # tokens of the trained rows (what padding-free rows forward)
    unique_tokens: int  # distinct (episode, prefix) tokens of the trained rows: the least exact forward
    loss: float
    pg_loss: float
    kl: float
    ratio_mean: float
    clip_frac: float
    # Off-policy tokens (max_policy_lag > 0; trainer/loss.py): how far the learner's weights had moved
    # from the policy that sampled them. A mean IS weight far from 1 or a large truncated fraction says
    # the samples are far off-policy (e.g. a learning rate that moves the policy a lot per step).
    stale_tokens: int = 0  # loss tokens sampled by an older version than the weights updated
    is_weight_mean: float = 0.0  # mean truncated IS weight min(pi_learner / pi_behaviour, cap); 0: none
    is_truncated_frac: float = 0.0  # fraction of the stale tokens whose weight was capped
    grad_norm: float
    lr: float
    skipped: bool  # no loss tokens, or a guard refusal skipped: counters advance, weights do not change
    # gradient guard (trainer/grad_guard.py): 1 when a pass was refused and LearnerConfig.guard_refusal
    # skipped the step or accepted the pass; the largest pass scale / anchor of the step; the anchor
    guard_refused: int = 0
    guard_ratio: float = 0.0
    guard_anchor: float = 0.0
    seconds: float
    tokens_per_s: float  # forwarded_tokens / seconds


@dataclass
class BatchLoss:
    """Sums over the micro-batches of one logical batch."""

    loss: float = 0.0
    pg_sum: float = 0.0
    kl_sum: float = 0.0
    ratio_sum: float = 0.0
    clipped: int = 0
    tokens: int = 0
    stale: int = 0  # tokens trained with truncated IS
    is_truncated: int = 0  # of which capped
    is_weight_sum: float = 0.0  # sum of their IS weights
    loss_weight: float = 0.0  # sum of |d loss / d logp| / T over the tokens (trainer/grad_guard.py)
    per_micro_batch: list[float] = field(default_factory=list)

    def add(self, out: LossOutputs, value: float, loss_weight: float) -> None:
        self.loss += value
        self.per_micro_batch.append(value)
        self.pg_sum += out.pg_sum
        self.kl_sum += out.kl_sum
        self.ratio_sum += out.ratio_sum
        self.clipped += out.clipped
        self.tokens += out.tokens
        self.stale += out.stale
        self.is_truncated += out.is_truncated
        self.is_weight_sum += out.is_weight_sum
        self.loss_weight += loss_weight

    SUMMED = ("loss", "pg_sum", "kl_sum", "ratio_sum", "clipped", "tokens", "stale", "is_truncated",
              "is_weight_sum", "loss_weight")  # fmt: skip


def pick_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_rngs(seed: int) -> None:
    """Seed python, numpy and torch (all devices); a resumed learner restores the saved states instead."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_policy(model_dir: Path, device: torch.device, *, trainable: bool) -> nn.Module:
    """A float32 HF causal LM in eval mode (no dropout); frozen unless `trainable`.

    Attention is trainer/attention.py's segment attention, which is plain SDPA unless a packed
    micro-batch passes its segment plan (so every layout runs on the same model object).
    """
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=SEGMENT_ATTENTION
    ).to(device)  # type: ignore[arg-type]  # transformers types `.to` as its decorator's wrapper
    model.eval()
    model.requires_grad_(trainable)
    return model


def build_optimizer(model: nn.Module, config: LearnerConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm scales and biases are not shrunk)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.adam_eps, **fused)


def _pass_loss(
    model: nn.Module,
    mb: MicroBatch,
    denominator: int,
    config: LearnerConfig,
    device: torch.device,
    reference: nn.Module | None,
    opts: PassOptions,
) -> tuple[LossOutputs, Tensor]:
    """One micro-batch's share of the batch loss, and its logprobs (differentiable)."""
    backend = AttentionBackend.SEGMENTS if opts.trusted else opts.backend
    kwargs = forward_kwargs(mb, device, backend)  # one attention plan for policy and reference
    ref = None
    if reference is not None and config.kl_coef > 0:
        with torch.no_grad():
            ref = score_tokens(reference, mb, config, device, kwargs=kwargs, trusted=opts.trusted)
    logprobs = score_tokens(  # float32 [N]
        model, mb, config, device, kwargs=kwargs, trusted=opts.trusted, full_logits=opts.full_logits
    )
    if logprobs.requires_grad:
        logprobs.retain_grad()  # d loss / d logp: the pass's loss weight (trainer/grad_guard.py)
    out = grpo_loss(
        LossInputs(
            logprobs=logprobs,
            behavior_logprobs=mb.behavior_logprobs.to(device, logprobs.dtype),
            advantages=mb.advantages.to(device, logprobs.dtype),
            ref_logprobs=ref,
            denominator=denominator,
            stale=_on(stale_mask(mb, opts.version), device),
        ),
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        kl_coef=config.kl_coef,
        is_cap=opts.is_cap,
    )
    return out, logprobs


@dataclass(frozen=True)
class PassOptions:
    """How `accumulate_gradients` runs its passes (defaults: one process, no guard)."""

    version: int | None = None  # policy version of the weights; older tokens get truncated IS
    is_cap: float = 2.0
    backend: str | None = None  # attention backend of packed layouts (None: trainer/attention_backend.py)
    trusted: bool = False  # the reference computations (trainer/scoring.py), e.g. the guard's probe
    full_logits: bool = False  # LM head over whole logits instead of chunks (benchmark comparison)
    guard: GradientGuard | None = None  # check every pass (trainer/grad_guard.py)
    step: int = 0  # the step number errors name
    after_pass: Callable[[int], None] | None = None  # called with the pass index after each backward
    reduce: Callable[[list[float]], list[float]] | None = None  # sum over ranks (None: one process)


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[MicroBatch],
    denominator: int,
    config: LearnerConfig,
    device: torch.device,
    reference: nn.Module | None = None,
    *,
    version: int | None = None,
    is_cap: float = 2.0,
    weights: Sequence[float] | None = None,
    options: PassOptions | None = None,
) -> BatchLoss:
    """Backward every micro-batch's share of the logical batch loss into `.grad` (accumulating).

    The step body of every learner engine. `version`: the policy version of the weights being
    updated; tokens sampled by an older one are trained with truncated IS capped at `is_cap`
    (trainer/loss.py); None: every token as today. `weights`: each pass's loss multiplier (default
    1; the distributed learner passes the world size, and 0 for a pass that only keeps collectives
    aligned); passes of weight 0 add nothing to the sums. With `options.guard`, every pass is
    checked before the next one (trainer/grad_guard.py) and a bad one raises.
    """
    opts = PassOptions(version=version, is_cap=is_cap) if options is None else options
    weights = [1.0] * len(micro_batches) if weights is None else list(weights)
    total = BatchLoss()
    params = [p for p in model.parameters() if p.requires_grad]
    for k, (mb, weight) in enumerate(zip(micro_batches, weights, strict=True)):
        own = separate_pass_gradient(params) if opts.guard is not None else contextlib.nullcontext()
        with own, pass_kernels(device, trusted=opts.trusted):
            out, logprobs = _pass_loss(model, mb, denominator, config, device, reference, opts)
            (out.loss if weight == 1.0 else out.loss * weight).backward()
            value, lw = 0.0, 0.0
            if weight != 0:
                value = float(out.loss.detach())
                lw = _loss_weight(logprobs, mb, device) / abs(weight)
                total.add(out, value, lw)
            if opts.guard is not None:  # before the pass's gradient joins the accumulated one
                _check_pass(opts, model, params, PassCheck(k, len(micro_batches), mb.row_ids, out.tokens,
                                                           value, lw, 0.0))  # fmt: skip
        if opts.after_pass is not None:
            opts.after_pass(k)
    return total


def _loss_weight(logprobs: Tensor, mb: MicroBatch, device: torch.device) -> float:
    """sum_i |d loss / d logp_i| / T_i: the pass's loss weight in temperature-free units
    (trainer/grad_guard.py: grad logp_i carries a 1 / T_i the scale must not)."""
    if logprobs.grad is None:
        return 0.0
    return float((logprobs.grad.abs() / mb.temperature.to(device, logprobs.grad.dtype)).sum())


def _check_pass(opts: PassOptions, model: nn.Module, params: list[nn.Parameter], local: PassCheck) -> None:
    """The guard's check of one pass: its numbers summed over ranks, its own gradient's norm."""
    guard = opts.guard
    assert guard is not None  # called only where a guard checks the passes
    loss, weight, tokens = local.loss, local.loss_weight, float(local.tokens)
    if opts.reduce is not None:
        loss, weight, tokens = opts.reduce([loss, weight, float(tokens)])
    norm = grad_norm(params)  # .grad holds only this pass's gradient here
    check = dataclasses.replace(local, loss=loss, loss_weight=weight, tokens=int(tokens), grad_norm=norm)
    guard.check(check, opts.step, [] if finite(loss, norm) else non_finite_parameters(model))


@dataclass(frozen=True)
class PreparedBatch:
    """A validated logical batch: per-episode advantages, the loss denominator, the micro-batch plan."""

    advantages: dict[str, EpisodeAdvantage]
    denominator: int  # unique eligible tokens of the valid episodes
    plan: list[MicroBatch]
    unique_tokens: int  # distinct (episode, prefix) tokens of the trained rows


def prepare_batch(
    rows: Sequence[Row],
    config: LearnerConfig,
    episodes: Sequence[EpisodeRecord] | None = None,
    *,
    budget: int | None = None,
) -> PreparedBatch:
    """Validate rows, compute episode advantages and the denominator, and plan the micro-batches.

    `episodes`: the step's episode records (every logical rollout, rows or not); None derives them
    from the rows (trainer/advantages.py explains what that form cannot see).
    `budget`: tokens per micro-batch (default `config.micro_batch_tokens`; the learner passes the
    smaller of it and the memory limit's budget).
    """
    validate_rows(rows)
    adv = episode_advantages(
        rows, episodes, std_scaling=config.adv_std_scaling, eps=config.adv_eps,
        failure_reward=config.failure_reward,
    )  # fmt: skip
    per_episode = {e: a.advantage for e, a in adv.items()}
    budget = config.micro_batch_tokens if budget is None else budget
    if config.layout == "padded":
        plan = plan_micro_batches(rows, per_episode, budget)
    else:
        plan = plan_packed_micro_batches(rows, per_episode, config.layout, budget)
    return PreparedBatch(adv, unique_eligible_tokens(rows), plan, unique_prefix_tokens(rows))


def probe_micro_batch(
    rows: Sequence[Row], advantages: dict[str, EpisodeAdvantage], config: LearnerConfig
) -> MicroBatch | None:
    """The gradient guard's probe: the shortest trained row that carries loss weight, alone, padded."""
    per_episode = {e: a.advantage for e, a in advantages.items()}
    weighted = [r for r in trained_rows(rows) if per_episode[r.episode_id] != 0 or config.kl_coef > 0]
    if not weighted:
        return None
    row = min(weighted, key=lambda r: (len(r.input_ids), r.row_id))
    return plan_micro_batches([row], per_episode, len(row.input_ids))[0]


def probe_scale(model: nn.Module, mb: MicroBatch, config: LearnerConfig, device: torch.device) -> float:
    """The gradient guard's anchor (trainer/grad_guard.py): the gradient norm of T / m times the sum of
    the logprobs of the probe row's first m = PROBE_TOKENS tokens at T = PROBE_TEMPERATURE and top_p 1
    (loss weight 1), on the reference computations. Leaves its gradient in `.grad`."""
    hot = dataclasses.replace(
        mb, temperature=torch.full_like(mb.temperature, PROBE_TEMPERATURE), top_p=torch.ones_like(mb.top_p)
    )
    with pass_kernels(device, trusted=True):
        logp = score_tokens(model, hot, config, device, trusted=True)
        m = min(PROBE_TOKENS, logp.numel())
        (logp[:m].sum() * (PROBE_TEMPERATURE / m)).backward()
    return grad_norm(p for p in model.parameters() if p.requires_grad)


class Learner:
    """The policy, its optimizer and the run's counters; `step(rows)` takes one optimizer step."""

    def __init__(
        self,
        model_dir: Path,
        config: LearnerConfig,
        *,
        device: str | torch.device | None = None,
        reference_dir: Path | None = None,
        step_count: int = 0,
        rollouts_consumed: int = 0,
    ) -> None:
        seed_rngs(config.seed)
        self.config = config
        self.model_dir = Path(model_dir)  # tokenizer files for checkpoints are copied from here
        self.device = pick_device(device)
        self.model = load_policy(self.model_dir, self.device, trainable=True)
        if config.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.budget = config.micro_batch_tokens
        if config.memory_limit_mb is not None:
            derived = token_budget(
                self.model.config, config.memory_limit_mb, checkpointing=config.activation_checkpointing,
                full_logits=plain_head(self.model) is None,
            )  # fmt: skip
            self.budget = min(self.budget, derived)
        self.optimizer = build_optimizer(self.model, config, self.device)
        self.reference = None
        if config.kl_coef > 0:
            if reference_dir is None:
                raise ReferenceModelError(
                    f"kl_coef={config.kl_coef} needs a frozen reference: pass reference_dir (usually the "
                    "base model folder), or set kl_coef=0"
                )
            self.reference = load_policy(Path(reference_dir), self.device, trainable=False)
        self.step_count = step_count  # = policy version of the current weights
        self.rollouts_consumed = rollouts_consumed
        self.last_advantages: dict[str, EpisodeAdvantage] = {}  # per episode, of the last step taken
        self.is_cap = 2.0  # truncated IS cap of stale tokens (RunConfig.off_policy_is_cap, trainer/loss.py)
        # attention kernel of packed/tree micro-batches (trainer/attention_backend.py; a benchmark may
        # set "segments" or "flex" to compare them)
        self.attention_backend: str = choose_backend(self.device)
        self.guard = GradientGuard()  # its anchor and history are checkpointed (trainer/checkpoint.py)
        self.last_refusal: dict | None = None  # evidence of the last step's skipped or accepted refusal
        self.full_logits = False  # True: score from whole [tokens, vocab] logits (benchmark comparison)

    def _check_rollouts(self, episodes: int) -> None:
        want = self.config.rollouts_per_step
        if want is not None and episodes != want:
            raise RolloutCountError(
                f"step {self.step_count + 1}: the batch holds {episodes} logical rollouts (episodes), the "
                f"config says rollouts_per_step={want}; an incomplete or duplicated batch never completes "
                "an optimizer step (wait for every episode, or fix the group size)"
            )

    def step(self, rows: Sequence[Row], episodes: Sequence[EpisodeRecord] | None = None) -> StepMetrics:
        """One optimizer step on the rows of one logical batch (all episodes of the step's groups).

        `episodes`: one record per episode of the step (see prepare_batch); they are what
        `rollouts_per_step` and the LR schedule count.
        """
        started = time.perf_counter()
        batch = prepare_batch(rows, self.config, episodes, budget=self.budget)
        self._check_rollouts(len(batch.advantages))
        rollouts = len(batch.advantages)
        lr = self.config.lr_at(self.rollouts_consumed + rollouts)
        self.optimizer.zero_grad(set_to_none=True)
        total, grad_norm = BatchLoss(), 0.0
        guard: dict[str, Any] = {}
        self.last_refusal = None
        if batch.denominator > 0:
            total, grad_norm, guard = self._guarded_update(batch, rows, lr)
        self.step_count += 1
        self.rollouts_consumed += rollouts
        self.last_advantages = batch.advantages
        metrics = self._metrics(batch, rows, total, rollouts, grad_norm, lr, time.perf_counter() - started)
        return metrics.model_copy(update=guard)

    def _guarded_update(
        self, batch: PreparedBatch, rows: Sequence[Row], lr: float
    ) -> tuple[BatchLoss, float, dict]:
        """Accumulate, check and apply one step; a refusal raises (guard_refusal "fail") or leaves the
        weights and optimizer untouched ("skip"; "accept" trains an implausible pass as computed)."""
        mode = self.config.guard_refusal
        try:
            self.guard.begin_step(accept_implausible=mode == "accept")
            self._probe(batch, rows)
            total = self._accumulate(batch)
            grad_norm = self._apply_update(lr)
        except GradientRefusal as refusal:
            self.optimizer.zero_grad(set_to_none=True)  # nothing of the refused step survives
            if mode == "fail":
                raise
            self.last_refusal = refusal.evidence
            guard = {"guard_refused": 1, "guard_anchor": self.guard.reference() or 0.0, "skipped": True}
            self.guard.begin_step()  # the refused step's scales and probe are not kept
            return BatchLoss(), 0.0, guard
        self.last_refusal = self.guard.accepted
        guard = {
            "guard_refused": int(self.guard.accepted is not None),
            "guard_ratio": self.guard.worst_ratio(),
            "guard_anchor": self.guard.reference() or 0.0,
        }
        self.guard.commit()
        return total, grad_norm, guard

    def _options(self, **overrides) -> PassOptions:
        """This learner's pass options for the step being taken."""
        base = PassOptions(
            version=self.step_count, is_cap=self.is_cap, backend=self.attention_backend, guard=self.guard,
            step=self.step_count + 1, full_logits=self.full_logits,
        )  # fmt: skip
        return dataclasses.replace(base, **overrides)

    def _accumulate(self, batch: PreparedBatch) -> BatchLoss:
        """Every micro-batch's gradient into `.grad`, each pass checked by the guard."""
        return accumulate_gradients(
            self.model, batch.plan, batch.denominator, self.config, self.device, self.reference,
            options=self._options(),
        )  # fmt: skip

    def _probe(self, batch: PreparedBatch, rows: Sequence[Row]) -> None:
        """A learner without an anchor measures it on the reference computations first
        (trainer/grad_guard.py); its gradient is dropped. Every rank runs the same probe."""
        if not self.guard.needs_probe():
            return
        mb = probe_micro_batch(rows, batch.advantages, self.config)
        if mb is None:
            return
        self.optimizer.zero_grad(set_to_none=True)
        scale = probe_scale(self.model, mb, self.config, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        self.guard.calibrate(scale)

    def _metrics(
        self,
        batch: PreparedBatch,
        rows: Sequence[Row],
        total: BatchLoss,
        rollouts: int,
        grad_norm: float,
        lr: float,
        seconds: float,
    ) -> StepMetrics:
        """What this step did, from its prepared batch and accumulated loss (every learner engine)."""
        denominator = max(batch.denominator, 1)
        forwarded = sum(mb.real_tokens for mb in batch.plan)
        return StepMetrics(
            step=self.step_count,
            rollouts=rollouts,
            rollouts_consumed=self.rollouts_consumed,
            **_rollout_counts(batch.advantages.values(), rows),
            rows=len(rows),
            micro_batches=len(batch.plan),
            loss_tokens=batch.denominator,
            forwarded_tokens=forwarded,
            padded_tokens=sum(mb.padded_tokens for mb in batch.plan),
            row_tokens=sum(mb.row_tokens for mb in batch.plan),
            unique_tokens=batch.unique_tokens,
            loss=total.loss,
            pg_loss=total.pg_sum / denominator,
            kl=total.kl_sum / denominator,
            ratio_mean=total.ratio_sum / max(total.tokens, 1),
            clip_frac=total.clipped / max(total.tokens, 1),
            stale_tokens=total.stale,
            is_weight_mean=total.is_weight_sum / max(total.stale, 1),
            is_truncated_frac=total.is_truncated / max(total.stale, 1),
            grad_norm=grad_norm,
            lr=lr,
            skipped=batch.denominator == 0,
            seconds=seconds,
            tokens_per_s=forwarded / seconds if seconds > 0 else 0.0,
        )

    def _apply_update(self, lr: float) -> float:
        """Clip, check, set the LR and step the optimizer; returns the pre-clip global grad norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not torch.isfinite(torch.tensor(norm)):  # the guard checked every pass; this is the sum
            raise NonFiniteError(
                f"step {self.step_count + 1}: gradient norm is {norm}; the optimizer step was not taken. "
                "Look for -inf logprobs (a sampled token outside the current top-p set with kl_coef > 0) "
                "or corrupt behaviour logprobs",
                {"kind": "non-finite", "step": self.step_count + 1, "pass": None, "grad_norm": str(norm)},
            )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def _on(t: Tensor | None, device: torch.device) -> Tensor | None:
    return None if t is None else t.to(device)


def _rollout_counts(advantages: Iterable[EpisodeAdvantage], rows: Sequence[Row]) -> dict[str, int]:
    """How the batch's episodes entered the step: trained, in the baseline, excluded, by failure kind."""
    adv = list(advantages)
    with_rows = {r.episode_id for r in rows}
    failed = {kind: sum(a.failure_kind == kind for a in adv) for kind in FAILURE_KINDS}
    return {
        "valid_rollouts": sum(a.valid for a in adv),
        "baseline_rollouts": sum(a.in_baseline for a in adv),
        "excluded_rollouts": sum(not a.in_baseline for a in adv),
        "policy_failed_rollouts": failed["policy"],
        "infrastructure_failed_rollouts": failed["infrastructure"],
        "rowless_rollouts": sum(a.episode_id not in with_rows for a in adv),
    }
