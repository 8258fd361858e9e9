"""FlexAttention over a packed or tree micro-batch's ancestor mask: the CUDA attention path.

A packed/tree micro-batch is one flat pre-order sequence where query q sees key k exactly when
k <= q < subtree_end[k] (trainer/packing.py). FlexAttention (torch.nn.attention.flex_attention)
runs one fused kernel over the whole sequence and skips every 128 x 128 tile that no pair of the
mask touches, so its cost follows the real pairs without trainer/attention.py's buckets (no gather,
pad, scatter, no masked dense call per bucket). The `BlockMask` is built here from `subtree_end`
directly (no [N, N] mask is ever materialised): per (query tile, key tile) the number of visible
pairs is summed from each key's query interval [k, subtree_end[k]); a tile with none is skipped, a
tile where every pair is visible is "full" (the kernel skips the mask there), the rest are partial
and evaluate `mask_mod` per element.

The sequence is padded to `padded_length(N)` (a few sizes per octave, so the compiled kernel sees
few distinct shapes; `torch.compile(dynamic=False)` compiles once per size). Pad tokens see only
themselves and no real token sees them (k > q for every real q), so their tiles cost nothing and the
real outputs are unchanged. On CUDA the kernel is `torch.compile(flex_attention)`; elsewhere the
eager (reference) implementation runs, which is what the CPU tests compare against the dense mask
(torch 2.13 has no FlexAttention backward on CPU: the learner's CPU path is trainer/attention.py).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128  # FlexAttention's default sparse tile (query and key)
PADDED_SIZES_PER_OCTAVE = 8  # padded lengths: multiples of next_power_of_two(N) / 8 (pad < N / 4)
RECOMPILE_LIMIT = 64  # one compiled kernel per padded size (and grad mode); the default limit is 8


def padded_length(n: int) -> int:
    """N rounded up to a multiple of max(BLOCK, next power of two / PADDED_SIZES_PER_OCTAVE)."""
    step = max(BLOCK, (1 << max(n - 1, 1).bit_length()) // PADDED_SIZES_PER_OCTAVE)
    return -(-n // step) * step


def padded_ends(subtree_end: np.ndarray, padded: int) -> np.ndarray:
    """subtree_end extended over the pads: a pad at position k sees only itself (end k + 1)."""
    ends = np.arange(1, padded + 1, dtype=np.int64)
    ends[: subtree_end.size] = subtree_end
    return ends


def tile_pair_counts(ends: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Visible (q, k) pairs per (query tile, key tile): int64 [tiles, tiles].

    Key k is seen by the queries [k, ends[k]); that interval covers its first query tile partly,
    the tiles in between fully and its last tile partly. Summed with a difference array over the
    fully covered tiles, O(N + tiles^2).
    """
    n = ends.size
    tiles = n // block
    k = np.arange(n, dtype=np.int64)
    kt = k // block
    first, last = k // block, (ends - 1) // block
    counts = np.zeros((tiles, tiles + 1), dtype=np.int64)  # [query tile, key tile]; +1: diff spill
    same = first == last
    np.add.at(counts, (first[same], kt[same]), ends[same] - k[same])
    split = ~same
    np.add.at(counts, (first[split], kt[split]), (first[split] + 1) * block - k[split])
    np.add.at(counts, (last[split], kt[split]), ends[split] - last[split] * block)
    # fully covered query tiles first+1 .. last-1 get `block` pairs each: a difference array down
    # the query axis, per key tile
    diff = np.zeros((tiles + 1, tiles), dtype=np.int64)
    inner = split & (last > first + 1)
    np.add.at(diff, (first[inner] + 1, kt[inner]), block)
    np.add.at(diff, (last[inner], kt[inner]), -block)
    counts[:, :tiles] += np.cumsum(diff, axis=0)[:tiles]
    return counts[:, :tiles]


def _tile_lists(select: np.ndarray) -> tuple[Tensor, Tensor]:
    """bool [tiles, tiles] -> (count per query tile [1, 1, T], key tiles listed first [1, 1, T, T])."""
    num = select.sum(axis=1).astype(np.int32)
    order = np.argsort(~select, axis=1, kind="stable").astype(np.int32)  # selected tiles first, ascending
    return torch.from_numpy(num)[None, None], torch.from_numpy(order)[None, None]


def _ancestor_mask_mod(ends: Tensor):
    """mask_mod of FlexAttention: k is an ancestor-or-self of q (one code object for every call)."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < ends[kv_idx])

    return mask_mod


@dataclass(frozen=True)
class FlexPlan:
    """One micro-batch's BlockMask and its real / padded lengths."""

    block_mask: BlockMask
    length: int
    padded: int


def flex_plan(subtree_end: np.ndarray, device: torch.device) -> FlexPlan:
    """The BlockMask of the ancestor rule k <= q < subtree_end[k] over the padded sequence."""
    n = int(subtree_end.size)
    padded = padded_length(n)
    ends = padded_ends(subtree_end, padded)
    counts = tile_pair_counts(ends)
    full = counts == BLOCK * BLOCK
    partial = (counts > 0) & ~full
    kv_num, kv_idx = _tile_lists(partial)
    full_num, full_idx = _tile_lists(full)
    ends_t = torch.from_numpy(ends.astype(np.int32)).to(device)
    mask = BlockMask.from_kv_blocks(
        kv_num.to(device), kv_idx.to(device), full_num.to(device), full_idx.to(device),
        BLOCK_SIZE=BLOCK, mask_mod=_ancestor_mask_mod(ends_t), seq_lengths=(padded, padded),
    )  # fmt: skip
    return FlexPlan(mask, n, padded)


@functools.cache
def _compiled_flex():
    """flex_attention compiled once per process (static shapes: one kernel per padded size)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False)


def flex_ancestor_attention(query: Tensor, key: Tensor, value: Tensor, plan: FlexPlan, scale) -> Tensor:
    """query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D] under the plan's ancestor mask."""
    pad = plan.padded - plan.length
    if pad:
        query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (query, key, value))
    gqa = query.shape[1] != key.shape[1]
    if query.is_cuda:
        out = _compiled_flex()(query, key, value, block_mask=plan.block_mask, scale=scale, enable_gqa=gqa)
    else:  # the eager reference implementation (CPU tests); torch warns that it is unfused
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(query, key, value, block_mask=plan.block_mask, scale=scale, enable_gqa=gqa)
    return out[:, :, : plan.length].transpose(1, 2).contiguous()
