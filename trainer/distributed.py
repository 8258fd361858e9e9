"""Data-parallel learner with sharded parameters and optimizer state (FSDP2), one process per rank.

Run under `torchrun` (gloo on CPU, NCCL on CUDA); the process group comes from its environment.
Every rank validates and plans the same logical batch (planning is deterministic), then takes its
share of the micro-batches: longest first, each to the rank with the fewest forwarded tokens so far
(a unique-token budget: a tree micro-batch costs its unique tokens). Every micro-batch's loss is
divided by the *whole* batch's unique eligible tokens, and FSDP's reduce-scatter averages over
ranks, so each rank scales its loss by the world size: the summed gradient is the single-process
gradient whatever the split. FSDP collectives need the same number of forward/backward passes on
every rank, so a rank with fewer micro-batches runs a zero-weighted pass of one of its own (or the
batch's first) micro-batches.

The train_step activity runs it when `LearnerConfig.ranks > 1` (activities/train_ranks.py launches
and supervises the rank processes). State crosses steps through the checkpoint only: the weights as
a full Hugging Face folder (what vLLM loads), the AdamW state sharded per rank with
torch.distributed.checkpoint (`save_sharded_optimizer` / `load_optimizer`), which reshards onto
another rank count; a single-process checkpoint's `optimizer.pt` loads onto N ranks too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from grove.episodes import EpisodeRecord
from trainer.batch import MicroBatch
from trainer.learner import BatchLoss, Learner, StepMetrics, _on, prepare_batch, score_tokens
from trainer.loss import LossInputs, grpo_loss
from trainer.off_policy import stale_mask
from trainer.rows import Row


def split_micro_batches(plan: Sequence[MicroBatch], world: int) -> list[list[int]]:
    """Indices of `plan` per rank: longest first to the least-loaded rank (ties: lowest rank)."""
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(plan)), key=lambda i: (-plan[i].real_tokens, i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[rank].append(i)
        load[rank] += plan[i].real_tokens
    return [sorted(ix) for ix in out]


class DistributedLearner(Learner):
    """`Learner` whose decoder layers and root are `fully_shard`ed over the default process group."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.reference is not None:
            raise NotImplementedError("kl_coef > 0 is not supported by the distributed learner yet")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        for layer in self.model.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        # Shard first, then build the optimizer over the sharded (DTensor) parameters.
        from trainer.learner import build_optimizer

        self.optimizer = build_optimizer(self.model, self.config, self.device)
        # Called with the pass index after each forward/backward pass of a step (tests hold a rank
        # there with a gate to kill it mid-step; None in production).
        self.after_pass: Callable[[int], None] | None = None

    def step(self, rows: Sequence[Row], episodes: Sequence[EpisodeRecord] | None = None) -> StepMetrics:
        started = time.perf_counter()
        batch = prepare_batch(rows, self.config, episodes, budget=self.budget)
        self._check_rollouts(len(batch.advantages))
        rollouts = len(batch.advantages)
        lr = self.config.lr_at(self.rollouts_consumed + rollouts)
        self.optimizer.zero_grad(set_to_none=True)
        total, grad_norm = BatchLoss(), 0.0
        if batch.denominator > 0:
            total = self._accumulate(batch.plan, batch.denominator)
            grad_norm = self._apply_update(lr)
        self.step_count += 1
        self.rollouts_consumed += rollouts
        self.last_advantages = batch.advantages
        # kl stays 0: this engine refuses kl_coef > 0, so total.kl_sum is never added to
        return self._metrics(batch, rows, total, rollouts, grad_norm, lr, time.perf_counter() - started)

    def _accumulate(self, plan: Sequence[MicroBatch], denominator: int) -> BatchLoss:
        shares = split_micro_batches(plan, self.world)
        mine = shares[self.rank]
        passes = max(len(s) for s in shares)
        # loss, pg, ratio, clipped, tokens, stale, is_truncated, is_weight_sum
        sums = torch.zeros(8, dtype=torch.float64)
        for k in range(passes):
            real = k < len(mine)
            mb = plan[mine[k] if real else (mine[0] if mine else 0)]
            logprobs = score_tokens(self.model, mb, self.config, self.device)
            out = grpo_loss(
                LossInputs(
                    logprobs=logprobs,
                    behavior_logprobs=mb.behavior_logprobs.to(self.device, logprobs.dtype),
                    advantages=mb.advantages.to(self.device, logprobs.dtype),
                    ref_logprobs=None,
                    denominator=denominator,
                    stale=_on(stale_mask(mb, self.step_count), self.device),
                ),
                clip_low=self.config.clip_low,
                clip_high=self.config.clip_high,
                kl_coef=0.0,
                is_cap=self.is_cap,
            )
            # FSDP averages gradients over ranks; x world makes the reduction a sum. A padding pass
            # (weight 0) only keeps the collectives of all ranks in step.
            (out.loss * (self.world if real else 0.0)).backward()
            if self.after_pass is not None:
                self.after_pass(k)
            if real:
                mine_sums = [float(out.loss.detach()), out.pg_sum, out.ratio_sum, out.clipped, out.tokens]
                mine_sums += [out.stale, out.is_truncated, out.is_weight_sum]
                sums += torch.tensor(mine_sums, dtype=torch.float64)
        dist.all_reduce(sums)
        loss, pg, ratio, clipped, tokens, stale, truncated, weights = sums.tolist()
        return BatchLoss(
            loss=loss, pg_sum=pg, ratio_sum=ratio, clipped=int(clipped), tokens=int(tokens),
            stale=int(stale), is_truncated=int(truncated), is_weight_sum=weights,
        )  # fmt: skip

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters (every rank takes part; every rank gets them)."""
        return {k: v.full_tensor().detach().clone() for k, v in self.model.state_dict().items()}

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters on CPU (a collective: every rank calls it; every rank gets them)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)


OPTIMIZER_KEY = "optimizer"  # the one entry of the DCP state dict


def save_sharded_optimizer(learner: DistributedLearner, out_dir: Path) -> None:
    """Each rank writes its shard of the AdamW state (`__{rank}_0.distcp`), rank 0 the `.metadata`.

    Keys are parameter names (FQNs), so the files reshard onto any rank count, or one process.
    """
    state = get_optimizer_state_dict(learner.model, learner.optimizer)
    dcp.save({OPTIMIZER_KEY: state}, checkpoint_id=str(out_dir))


def load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, shards_dir: Path) -> None:
    """Load DCP optimizer shards into `optimizer` (sharded model under a process group, or a plain
    model in one process: DCP reads each tensor's slices from whichever shards hold them)."""
    state = get_optimizer_state_dict(model, optimizer)  # the layout to fill, in this run's sharding
    dcp.load({OPTIMIZER_KEY: state}, checkpoint_id=str(shards_dir))
    set_optimizer_state_dict(model, optimizer, state)


def named_full_optimizer_state(saved: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A single-process `optimizer.state_dict()` (keys: parameter indices in param-group order) with
    parameter names as keys instead, the form `set_optimizer_state_dict` takes. Both learners build
    their AdamW groups the same way (trainer/learner.py build_optimizer), so index i of group g is
    the same parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    index_to_name: dict[int, str] = {}
    groups = []
    for own, group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        if len(own["params"]) != len(group["params"]):
            raise ValueError(
                f"optimizer.pt has a param group of {len(group['params'])} parameters, this model "
                f"{len(own['params'])}: it was saved for another model"
            )
        index_to_name.update({i: names[id(p)] for i, p in zip(group["params"], own["params"], strict=True)})
        groups.append({**group, "params": [index_to_name[i] for i in group["params"]]})
    return {"state": {index_to_name[i]: v for i, v in saved["state"].items()}, "param_groups": groups}


def load_full_optimizer(learner: DistributedLearner, saved: dict) -> None:
    """Load a single-process checkpoint's AdamW state (every rank holds the whole of it) into the shards."""
    state = named_full_optimizer_state(saved, learner.model, learner.optimizer)
    set_optimizer_state_dict(
        learner.model, learner.optimizer, state, options=StateDictOptions(full_state_dict=True)
    )
