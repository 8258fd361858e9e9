"""Attention over a packed or tree-packed sequence whose cost follows the real (query, key) pairs.

A packed micro-batch is one flat sequence of N tokens laid out in pre-order (trainer/packing.py):
token q may attend to key k exactly when k is an ancestor of q or q itself. The layout cuts the
sequence into *segments*, maximal runs of consecutive tokens each of which continues the previous
one; a segment's queries see its *context* (the ancestor runs above it, in full) and themselves
causally. A packed row is one segment with no context; a tree node shared by several rows is a
segment that its children's segments take as context.

Why not a mask over the whole bin: a dense [N, N] mask costs N^2 pairs however few are real, and
PyTorch's FlexAttention (block-sparse BlockMask) has no backward on CPU in torch 2.13
("FlexAttention does not support backward on CPU"). So segments of similar shape are gathered into
a few padded buckets (pairs computed <= `BUCKET_SLACK` x the real pairs' rectangle; linear layers
never see padding):

- segments without context: one plain causal SDPA call (no mask; the kernel skips the blocks above
  the diagonal);
- segments with context, on CPU: two flash-attention calls, queries x context (no mask: every
  context key is visible) and queries x the segment itself (causal), merged by their logsumexps
  (`_ContextCausal`). A single call over [context + segment] needs an explicit mask, and a masked
  kernel computes every pair of the [Lq, context + Lq] rectangle, the upper triangle of the
  segment's own square included: on the tree of bench/bench_learner.py (b) a quarter more pairs
  than the real ones (tests/learner/test_packing.py counts them). The backward of each part is the flash
  backward with the merged output and logsumexp (the blockwise identity ring attention uses), so
  the gradient is exact up to float rounding;
- segments with context elsewhere (CUDA without Triton): one SDPA call with the explicit
  [Lq, context + Lq] mask, which on CUDA runs SDPA's MATH kernel (trainer/attention_backend.py
  says which kernels the learner allows and why).

On CUDA the learner normally runs FlexAttention instead (trainer/flex_attention.py, one kernel
over the whole micro-batch); trainer/attention_backend.py chooses.

Registered with transformers as attention implementation `SEGMENT_ATTENTION`; it takes the plan as
the `segment_plan` (or `flex_plan`) keyword of the model's forward and falls back to SDPA without
one, so a model switched to it still runs padded batches exactly as SDPA does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from trainer.flex_attention import FlexPlan, flex_ancestor_attention

SEGMENT_ATTENTION = "grove_segments"
BUCKET_SLACK = 1.5  # a bucket's padded [Lq, Lk] area stays within 1.5x its segments' real areas
# Context buckets with fewer query rows take one masked call: for short segments the second call and
# the merge cost more than the upper triangle they save (bench (a): ~10-token segments).
SPLIT_MIN_QUERIES = 64


@dataclass(frozen=True)
class Segment:
    """Flat positions [start, end): they see `context` (ancestor ranges) and themselves causally."""

    start: int
    end: int
    context: tuple[tuple[int, int], ...]

    @property
    def context_len(self) -> int:
        return sum(e - s for s, e in self.context)

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Bucket:
    """Segments padded to one shape: queries (= the segments' own keys) [S, Lq], context keys [S, Lc].

    Pads index position 0. Own pads sit after every real query, so causal attention hides them; a
    context pad is hidden by `ctx_mask` (None when every context of the bucket has the same length).
    """

    q_index: Tensor  # int64 [S, Lq] flat positions of the queries, also the segments' own keys
    ctx_index: Tensor | None  # int64 [S, Lc] flat positions of the context keys; None: no context
    ctx_mask: Tensor | None  # bool [S, 1, Lq, Lc], True = attend; None: every context key is real

    def to(self, device: torch.device) -> Bucket:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return Bucket(self.q_index.to(device), move(self.ctx_index), move(self.ctx_mask))

    def dense_mask(self) -> Tensor:
        """bool [S, 1, Lq, Lc + Lq]: the bucket's mask over [context, own] keys (one SDPA call)."""
        s, lq = self.q_index.shape
        causal = torch.ones(lq, lq, dtype=torch.bool, device=self.q_index.device).tril()
        ctx = self.ctx_mask
        if ctx is None:
            lc = 0 if self.ctx_index is None else self.ctx_index.shape[1]
            ctx = torch.ones(s, 1, lq, lc, dtype=torch.bool, device=self.q_index.device)
        return torch.cat([ctx, causal.expand(s, 1, lq, lq)], dim=-1)


@dataclass(frozen=True)
class SegmentPlan:
    """Buckets plus `inverse`: the slot, in the concatenated bucket outputs, of each flat position."""

    buckets: tuple[Bucket, ...]
    inverse: Tensor  # int64 [N]

    def to(self, device: torch.device) -> SegmentPlan:
        return SegmentPlan(tuple(b.to(device) for b in self.buckets), self.inverse.to(device))

    @property
    def computed_pairs(self) -> int:
        """(query, key) pairs the buckets compute on CPU, padding included: the causal own part counts
        its lower triangle, the context part its whole rectangle."""
        total = 0
        for b in self.buckets:
            s, lq = b.q_index.shape
            lc = 0 if b.ctx_index is None else b.ctx_index.shape[1]
            if lc and lq < SPLIT_MIN_QUERIES:  # one masked call over [context + segment]
                total += s * lq * (lc + lq)
            else:
                total += s * lq * lc + s * lq * (lq + 1) // 2
        return total


def _group(segments: list[Segment]) -> list[list[Segment]]:
    """Buckets of segments with context and, apart, of segments without: a bucket holding one segment
    with context needs an explicit mask, and SDPA then computes every (query, key) pair of the
    bucket, where a causal bucket computes half; mixing them doubled the cost of the long context-free
    segments (a tree's root prefix)."""
    with_context = [s for s in segments if s.context]
    without = [s for s in segments if not s.context]
    return [g for part in (without, with_context) if part for g in _group_similar(part)]


def _group_similar(segments: list[Segment]) -> list[list[Segment]]:
    """Greedy buckets over segments sorted by key length: padded area <= BUCKET_SLACK x real area."""
    ordered = sorted(segments, key=lambda s: (-(s.context_len + s.length), -s.length, s.start))
    groups: list[list[Segment]] = []
    real = lq_max = lk_max = 0
    for seg in ordered:
        lq, lk = seg.length, seg.context_len + seg.length
        if groups:
            n, q, k = len(groups[-1]) + 1, max(lq_max, lq), max(lk_max, lk)
            if n * q * k <= BUCKET_SLACK * (real + lq * lk):
                groups[-1].append(seg)
                real, lq_max, lk_max = real + lq * lk, q, k
                continue
        groups.append([seg])
        real, lq_max, lk_max = lq * lk, lq, lk
    return groups


def _bucket(group: list[Segment]) -> Bucket:
    lq = max(s.length for s in group)
    lc = max(s.context_len for s in group)
    q_index = np.zeros((len(group), lq), dtype=np.int64)
    ctx_index = np.zeros((len(group), lc), dtype=np.int64)
    for i, seg in enumerate(group):
        q_index[i, : seg.length] = np.arange(seg.start, seg.end, dtype=np.int64)
        ctx = [np.arange(s, e, dtype=np.int64) for s, e in seg.context]
        if ctx:
            ctx_index[i, : seg.context_len] = np.concatenate(ctx)
    ctx_mask = None
    if any(s.context_len != lc for s in group):
        # Every query row (pads too) sees its segment's real context keys: no all-masked row.
        ctx_mask = np.zeros((len(group), 1, lq, lc), dtype=bool)
        for i, seg in enumerate(group):
            ctx_mask[i, 0, :, : seg.context_len] = True
    return Bucket(
        torch.from_numpy(q_index),
        torch.from_numpy(ctx_index) if lc else None,
        None if ctx_mask is None else torch.from_numpy(ctx_mask),
    )


def plan_segments(segments: Sequence[Segment], total: int) -> SegmentPlan:
    """Bucket the segments that tile [0, total) for `segment_attention`."""
    groups = _group(list(segments))
    inverse = np.full(total, -1, dtype=np.int64)
    offset = 0
    for group in groups:
        lq = max(s.length for s in group)
        for i, seg in enumerate(group):
            inverse[seg.start : seg.end] = offset + i * lq + np.arange(seg.length)
        offset += len(group) * lq
    if (inverse < 0).any():
        raise ValueError(f"segments do not cover position {int(np.flatnonzero(inverse < 0)[0])} of {total}")
    return SegmentPlan(tuple(_bucket(g) for g in groups), torch.from_numpy(inverse))


class _ContextCausal(torch.autograd.Function):
    """softmax attention of q over [context keys (all visible), own keys (causal)], CPU flash kernels.

    Each part is one flash call returning its output and logsumexp; the parts are merged by their
    logsumexps. Backward: the flash backward of each part given the *merged* output and logsumexp
    (the softmax over all keys is exp(score - lse) in every part), dq summed over the parts.
    """

    @staticmethod
    def forward(ctx, q, k_ctx, v_ctx, k_own, v_own, ctx_mask, scale):  # [S, H, L, D] each
        o_ctx, lse_ctx = _FLASH_CPU(q, k_ctx, v_ctx, attn_mask=ctx_mask, scale=scale)
        o_own, lse_own = _FLASH_CPU(q, k_own, v_own, is_causal=True, scale=scale)
        lse = torch.logaddexp(lse_ctx, lse_own)  # [S, H, Lq], float32 (float64 for float64 inputs)
        w_ctx = torch.exp(lse_ctx - lse).unsqueeze(-1)
        w_own = torch.exp(lse_own - lse).unsqueeze(-1)
        out = (o_ctx.to(lse.dtype) * w_ctx + o_own.to(lse.dtype) * w_own).to(q.dtype)
        ctx.save_for_backward(q, k_ctx, v_ctx, k_own, v_own, ctx_mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k_ctx, v_ctx, k_own, v_own, ctx_mask, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq_ctx, dk_ctx, dv_ctx = _FLASH_CPU_BACKWARD(
            grad, q, k_ctx, v_ctx, out, lse, 0.0, False, attn_mask=ctx_mask, scale=ctx.scale
        )
        dq_own, dk_own, dv_own = _FLASH_CPU_BACKWARD(
            grad, q, k_own, v_own, out, lse, 0.0, True, scale=ctx.scale
        )
        return dq_ctx + dq_own, dk_ctx, dv_ctx, dk_own, dv_own, None, None


_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _bucket_attention(b: Bucket, q: Tensor, k: Tensor, v: Tensor, scaling: float | None) -> Tensor:
    """One bucket: q [H, N, D], k/v [Hkv, N, D] (flat) -> [S, H, Lq, D]."""
    qg = q[:, b.q_index].transpose(0, 1)  # [S, H, Lq, D]
    gqa = q.shape[0] != k.shape[0]
    if b.ctx_index is None:
        kg, vg = (t[:, b.q_index].transpose(0, 1) for t in (k, v))  # [S, Hkv, Lq, D]
        return F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scaling, enable_gqa=gqa)
    if q.device.type != "cpu" or b.q_index.shape[1] < SPLIT_MIN_QUERIES:
        kv_index = torch.cat([b.ctx_index, b.q_index], dim=1)  # [S, Lc + Lq]
        kg, vg = (t[:, kv_index].transpose(0, 1) for t in (k, v))
        return F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=b.dense_mask(), scale=scaling, enable_gqa=gqa
        )
    if gqa:  # the CPU flash op takes as many key heads as query heads
        k, v = (t.repeat_interleave(q.shape[0] // k.shape[0], dim=0) for t in (k, v))
    k_ctx, v_ctx = (t[:, b.ctx_index].transpose(0, 1) for t in (k, v))  # [S, H, Lc, D]
    k_own, v_own = (t[:, b.q_index].transpose(0, 1) for t in (k, v))  # [S, H, Lq, D]
    mask = None  # the flash op takes an additive mask: 0 where visible, -inf at a context pad
    if b.ctx_mask is not None:
        mask = torch.zeros(b.ctx_mask.shape, dtype=q.dtype).masked_fill_(~b.ctx_mask, float("-inf"))
    return _ContextCausal.apply(qg, k_ctx, v_ctx, k_own, v_own, mask, scaling)


def segment_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segment_plan: SegmentPlan | None = None,
    flex_plan: FlexPlan | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D]."""
    if flex_plan is not None:
        return flex_ancestor_attention(query, key, value, flex_plan, scaling), None
    if segment_plan is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q, k, v = query[0], key[0], value[0]  # [H, N, D], [Hkv, N, D]
    heads, _, dim = q.shape
    outs = []
    for b in segment_plan.buckets:
        o = _bucket_attention(b, q, k, v, scaling)  # [S, H, Lq, D]
        outs.append(o.transpose(0, 1).reshape(heads, -1, dim))
    out = torch.cat(outs, dim=1)[:, segment_plan.inverse]  # [H, N, D]
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
