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

from trainer.batch import MicroBatch
from trainer.learner import BatchLoss, Learner, PreparedBatch, accumulate_gradients

_COUNTS = ("clipped", "tokens", "stale", "is_truncated")  # BatchLoss's integer sums


def _sum_over_ranks(values: list[float]) -> list[float]:
    """Element-wise sum of `values` over the process group (float64)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


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
        # torch types a submodule reached by attribute as Tensor | Module
        for layer in self.model.model.layers:  # type: ignore[union-attr]
            fully_shard(layer)
        fully_shard(self.model)
        # Shard first, then build the optimizer over the sharded (DTensor) parameters.
        from trainer.learner import build_optimizer

        self.optimizer = build_optimizer(self.model, self.config, self.device)
        # Called with the pass index after each forward/backward pass of a step (tests hold a rank
        # there with a gate to kill it mid-step; None in production).
        self.after_pass: Callable[[int], None] | None = None

    def _accumulate(self, batch: PreparedBatch) -> BatchLoss:
        """This rank's share of the micro-batches through the one step body (trainer/learner.py
        accumulate_gradients), then the sums over ranks. Every rank runs as many passes as the busiest."""
        shares = split_micro_batches(batch.plan, self.world)
        mine = shares[self.rank]
        passes = max(len(s) for s in shares)
        # a rank short of micro-batches repeats one of its own (or the batch's first) at weight 0
        plan = [batch.plan[mine[k] if k < len(mine) else (mine[0] if mine else 0)] for k in range(passes)]
        # FSDP averages gradients over ranks; x world makes the reduction a sum
        weights = [float(self.world) if k < len(mine) else 0.0 for k in range(passes)]
        total = accumulate_gradients(
            self.model, plan, batch.denominator, self.config, self.device, weights=weights,
            options=self._options(after_pass=self.after_pass, reduce=_sum_over_ranks),
        )  # fmt: skip
        sums = _sum_over_ranks([float(getattr(total, name)) for name in BatchLoss.SUMMED])
        out = BatchLoss()
        for name, value in zip(BatchLoss.SUMMED, sums, strict=True):
            setattr(out, name, int(value) if name in _COUNTS else value)
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters (every rank takes part; every rank gets them)."""
        return {k: v.full_tensor().detach().clone() for k, v in self.model.state_dict().items()}

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters on CPU (a collective: every rank calls it; every rank gets them)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        if len(tensors) != len(state):
            others = sorted(k for k in state if k not in tensors)
            raise TypeError(f"the model's state dict holds entries that are not tensors: {others[:5]}")
        return tensors


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
