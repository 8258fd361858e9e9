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
a few padded buckets and each bucket is one `scaled_dot_product_attention` call: plain causal
(no mask) for segments without context, an explicit [Lq, context + Lq] mask otherwise. Pairs
computed <= `BUCKET_SLACK` x the real pairs' rectangle; linear layers never see padding. The same
code runs on CUDA (SDPA's fused kernels); there a varlen/flex kernel would avoid the bucket padding.

Registered with transformers as attention implementation `SEGMENT_ATTENTION`; it takes the plan as
the `segment_plan` keyword of the model's forward and falls back to SDPA without one, so a model
switched to it still runs padded batches exactly as before.
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

SEGMENT_ATTENTION = "grove_segments"
BUCKET_SLACK = 1.5  # a bucket's padded [Lq, Lk] area stays within 1.5x its segments' real areas


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
    """Segments padded to one [S, Lq] x [S, Lk] shape; pads index position 0 and are masked out."""

    q_index: Tensor  # int64 [S, Lq] flat query positions
    kv_index: Tensor  # int64 [S, Lk] flat key positions: context then the segment itself
    mask: Tensor | None  # bool [S, 1, Lq, Lk], True = attend; None: no context, plain causal


@dataclass(frozen=True)
class SegmentPlan:
    """Buckets plus `inverse`: the slot, in the concatenated bucket outputs, of each flat position."""

    buckets: tuple[Bucket, ...]
    inverse: Tensor  # int64 [N]

    def to(self, device: torch.device) -> SegmentPlan:
        moved = tuple(
            Bucket(b.q_index.to(device), b.kv_index.to(device), None if b.mask is None else b.mask.to(device))
            for b in self.buckets
        )
        return SegmentPlan(moved, self.inverse.to(device))

    @property
    def computed_pairs(self) -> int:
        """(query, key) pairs the buckets compute, padding included (causal buckets count half)."""
        total = 0
        for b in self.buckets:
            s, lq = b.q_index.shape
            lk = b.kv_index.shape[1]
            total += s * lq * lk if b.mask is not None else s * lq * (lq + 1) // 2
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
    lk = max(s.context_len + s.length for s in group)
    q_index = np.zeros((len(group), lq), dtype=np.int64)
    kv_index = np.zeros((len(group), lk), dtype=np.int64)
    with_context = any(s.context for s in group)
    mask = np.zeros((len(group), 1, lq, lk), dtype=bool) if with_context else None
    for i, seg in enumerate(group):
        own = np.arange(seg.start, seg.end, dtype=np.int64)
        ctx = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in seg.context] + [own[:0]])
        q_index[i, : own.size] = own
        kv_index[i, : ctx.size + own.size] = np.concatenate([ctx, own])
        if mask is not None:
            mask[i, 0, : own.size, : ctx.size] = True
            mask[i, 0, : own.size, ctx.size : ctx.size + own.size] = np.tril(
                np.ones((own.size, own.size), bool)
            )
            mask[i, 0, own.size :, 0] = True  # pad queries see one key: no all-masked row, no NaN
    return Bucket(
        torch.from_numpy(q_index),
        torch.from_numpy(kv_index),
        None if mask is None else torch.from_numpy(mask),
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


def segment_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segment_plan: SegmentPlan | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D]."""
    if segment_plan is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q, k, v = query[0], key[0], value[0]  # [H, N, D], [Hkv, N, D]
    heads, _, dim = q.shape
    gqa = heads != k.shape[0]
    outs = []
    for b in segment_plan.buckets:
        qg = q[:, b.q_index].transpose(0, 1)  # [S, H, Lq, D]
        kg = k[:, b.kv_index].transpose(0, 1)  # [S, Hkv, Lk, D]
        vg = v[:, b.kv_index].transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=b.mask, is_causal=b.mask is None, scale=scaling, enable_gqa=gqa
        )  # [S, H, Lq, D]
        outs.append(o.transpose(0, 1).reshape(heads, -1, dim))
    out = torch.cat(outs, dim=1)[:, segment_plan.inverse]  # [H, N, D]
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
