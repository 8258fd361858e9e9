"""Which attention kernel the learner runs, on which device, and why: chosen here, explicitly.

Packed and tree micro-batches carry `PackedAttention` (what the layout says: query q sees key k iff
k <= q < subtree_end[k], and the same as segments); `attention_kwargs` turns it into the plan of the
backend `choose_backend` picks:

- **CPU: segments** (trainer/attention.py): causal SDPA per bucket of context-free segments, and for
  segments with context two CPU flash calls merged by logsumexp with an exact backward. FlexAttention
  has no backward on CPU (torch 2.13: "FlexAttention does not support backward on CPU"), and its
  eager forward is the unfused reference implementation.
- **CUDA: flex** (trainer/flex_attention.py): compiled FlexAttention with a BlockMask built from the
  tree, one kernel over the whole micro-batch, tiles without a visible pair skipped (ahead of the
  bucketed segment attention on CUDA, output within bf16 rounding of a float32 dense-mask reference:
  docs/results.md section 3.2).
  Requires Triton; without it CUDA falls back to segments.

**SDPA backends on CUDA: FLASH and MATH only** (`learner_sdpa`, wrapped around every forward *and*
backward of a learner pass, so activation-checkpoint recomputes are covered). On an H200 with bf16
autocast, cuDNN attention — what SDPA picks by default for the bucketed masked calls of the
segment path — returns NaN gradients for the packed layout and finite garbage, orders of magnitude
too large, for the tree; MATH and FLASH give correct gradients; EFFICIENT refuses the GQA shapes (it
does not take `enable_gqa`). So cuDNN is never allowed, EFFICIENT is not relied on,
FLASH serves the unmasked causal calls (padded rows, context-free buckets) and MATH the masked ones.
The CPU keeps SDPA's own choice (its flash kernel, or MATH), which is exact (tests/learner).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainer.attention import Segment, plan_segments
from trainer.flex_attention import flex_plan

# CUDA SDPA kernels the learner lets run (module docstring: cuDNN gave NaN/garbage gradients for the
# masked bf16 calls; EFFICIENT refuses GQA). Order = preference.
CUDA_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)


class AttentionBackend(StrEnum):
    SEGMENTS = "segments"  # trainer/attention.py buckets (CPU; CUDA without Triton)
    FLEX = "flex"  # trainer/flex_attention.py (CUDA)


class AttentionBackendError(ValueError):
    """An attention backend asked for where it cannot train (e.g. FlexAttention on CPU)."""


@dataclass(frozen=True)
class PackedAttention:
    """What a packed/tree layout says about attention: k is visible to q iff k <= q < subtree_end[k];
    `segments` is the same rule as runs of consecutive tokens with their ancestor context."""

    subtree_end: np.ndarray  # int64 [N]
    segments: tuple[Segment, ...]


@functools.cache
def flex_available() -> bool:
    """Compiled FlexAttention needs Triton (CUDA builds of torch ship it)."""
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


def choose_backend(device: torch.device, requested: AttentionBackend | str | None = None) -> AttentionBackend:
    """The backend for packed/tree micro-batches on `device` (module docstring says why).

    `requested` forces one (the benchmark compares them); FlexAttention cannot train on CPU.
    """
    if requested is not None:
        backend = AttentionBackend(requested)
        if backend is AttentionBackend.FLEX and device.type != "cuda":
            raise AttentionBackendError(
                f"attention backend 'flex' on {device.type}: FlexAttention has no backward there "
                "(torch raises 'FlexAttention does not support backward on CPU'); use 'segments'"
            )
        return backend
    if device.type == "cuda" and flex_available():
        return AttentionBackend.FLEX
    return AttentionBackend.SEGMENTS


def attention_kwargs(packed: PackedAttention, backend: AttentionBackend, device: torch.device) -> dict:
    """The model-forward keyword that carries this micro-batch's attention plan to trainer/attention.py."""
    n = int(packed.subtree_end.size)
    if backend is AttentionBackend.FLEX:
        return {"flex_plan": flex_plan(packed.subtree_end, device)}
    return {"segment_plan": plan_segments(packed.segments, n).to(device)}


def learner_sdpa(device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernels a learner pass may use on `device` (CUDA: FLASH, MATH; CPU: SDPA's choice)."""
    if device.type == "cuda":
        return sdpa_kernel(list(CUDA_SDPA_BACKENDS))
    return contextlib.nullcontext()
