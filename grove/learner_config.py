"""The learner's configuration: one typed, frozen object, checkpointed and fingerprinted.

Every number that changes what an optimizer step computes lives here, so a checkpoint can refuse a
run whose configuration differs (`fingerprint()`). Counts are in *logical rollouts* (episodes), never
in physical rows: how an episode is cut into rows must not change the schedule.

The learner has no sampling settings of its own: it scores each token under the temperature/top_p
its own call was sampled with (recorded per span in the rows). `temperature`/`top_p` remain only as
an optional, documented check: when set, RunConfig refuses a `sampling` that differs from them
(grove/contracts/run.py SamplingMismatchError); the learner never reads them. They stay so configs and
workflow histories written before per-span sampling still load (they carry 1.0/1.0).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Fields that say where a step runs, not what it computes; left out of the fingerprint (and so a config
# written before they existed keeps its fingerprint).
NOT_FINGERPRINTED = {"ranks"}


class LearnerConfig(BaseModel):
    """GRPO learner settings (see trainer/learner.py for the algorithm)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # optimizer (AdamW; decay on matrices only, never on norms and biases)
    lr: float = Field(1e-6, gt=0, description="peak learning rate (AdamW)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decay, on matrices only")
    grad_clip: float | None = Field(1.0, gt=0, description="max global grad norm; null: no clipping")

    # LR schedule, counted in logical rollouts consumed (including the current step's)
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="decay after warmup, to lr * min_lr_ratio at total_rollouts"
    )
    warmup_rollouts: int = Field(0, ge=0, description="linear warmup length in logical rollouts")
    total_rollouts: int | None = Field(
        None, gt=0, description="rollouts of the whole run; required by linear and cosine"
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final lr as a fraction of lr")

    # PPO-clip surrogate: ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio lower clip: 1 - clip_low")
    clip_high: float = Field(0.2, gt=0, description="PPO ratio upper clip: 1 + clip_high")

    # KL penalty to a frozen reference model (k3 estimator); 0 disables it and loads no reference
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the frozen base model (k3); 0: off")

    # NOT used for scoring (each token is scored under its span's recorded sampling). Optional check
    # only: when set, RunConfig requires sampling.temperature/top_p to equal them.
    temperature: float | None = Field(
        None, gt=0, description="optional check: must equal sampling.temperature; never used for scoring"
    )
    top_p: float | None = Field(
        None, gt=0, le=1, description="optional check: must equal sampling.top_p; never used for scoring"
    )

    # GRPO advantages
    adv_std_scaling: bool = Field(True, description="divide advantages by the group std; false: A = r - mean")
    adv_eps: float = Field(1e-6, gt=0, description="added to the group std")
    # the reward a policy-caused failure enters its group's baseline with (trainer/advantages.py);
    # infrastructure failures are excluded from the baseline instead
    failure_reward: float = Field(
        0.0, allow_inf_nan=False, description="baseline reward of an episode the policy failed (no loss)"
    )

    # batch shape: the logical batch size, and the token budget of one micro-batch
    rollouts_per_step: int | None = Field(
        None, gt=0, description="required episodes per step; null: any number"
    )
    micro_batch_tokens: int = Field(
        8192,
        gt=0,
        description="token budget of one micro-batch: padded tokens, or forwarded tokens when packed",
    )

    # how rows become forwards (trainer/packing.py). All three compute the same loss and gradient
    # up to float rounding; the layout only changes cost.
    layout: Literal["padded", "packed", "tree"] = Field(
        "padded",
        description="padded: rows right-padded (the original); packed: rows end to end, no padding; "
        "tree: each episode's rows as a token trie, every distinct prefix forwarded once",
    )

    # memory (trainer/memory.py): recompute layers in backward; derive the token budget of a
    # micro-batch from an activation-memory limit (the smaller of it and micro_batch_tokens)
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer in backward instead of keeping activations"
    )
    memory_limit_mb: int | None = Field(
        None, gt=0, description="activation memory of one micro-batch; null: micro_batch_tokens alone"
    )

    seed: int = Field(0, description="learner RNG seed")

    # where a step runs, not what it computes (so not fingerprinted: a checkpoint resumes onto any
    # rank count). 1: the Learner inside the trainer worker (the default and the tested CPU path);
    # N > 1: the train_step activity launches N FSDP2 rank processes per step (activities/train_ranks.py,
    # gloo on CPU, NCCL on CUDA) and the checkpoint's optimizer state is sharded per rank.
    ranks: int = Field(1, ge=1, le=64, description="learner processes of one step (data parallel, FSDP2)")

    @model_validator(mode="after")
    def _schedule_needs_total(self) -> LearnerConfig:
        if self.lr_schedule != "constant" and self.total_rollouts is None:
            raise ValueError(
                f"lr_schedule={self.lr_schedule!r} decays to total_rollouts; set total_rollouts "
                "(the number of logical rollouts of the whole run) or use lr_schedule='constant'"
            )
        if self.total_rollouts is not None and self.warmup_rollouts >= self.total_rollouts:
            raise ValueError(
                f"warmup_rollouts ({self.warmup_rollouts}) must be < total_rollouts ({self.total_rollouts})"
            )
        if self.ranks > 1 and self.kl_coef > 0:
            # refused here, before a run is admitted, not as a rank failing every retry
            raise ValueError(
                f"ranks={self.ranks} with kl_coef={self.kl_coef}: the distributed learner does not load "
                "the frozen reference model yet; use ranks=1 for a KL penalty, or kl_coef=0"
            )
        return self

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of every field that changes what a step computes (all but
        `ranks`): a checkpoint only resumes the same config, on any number of ranks."""
        fields = self.model_dump(mode="json", exclude=NOT_FINGERPRINTED)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def lr_at(self, rollouts_consumed: int) -> float:
        """Learning rate of the step after which `rollouts_consumed` rollouts have been trained on.

        Linear warmup over `warmup_rollouts`, then constant, linear or cosine decay to
        lr * min_lr_ratio at `total_rollouts` (held there afterwards).
        """
        n = rollouts_consumed
        if self.warmup_rollouts and n < self.warmup_rollouts:
            return self.lr * n / self.warmup_rollouts
        if self.lr_schedule == "constant":
            return self.lr
        assert self.total_rollouts is not None  # the validator guarantees it
        progress = min(1.0, (n - self.warmup_rollouts) / (self.total_rollouts - self.warmup_rollouts))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        shape = 1.0 - progress if self.lr_schedule == "linear" else cosine
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape)
