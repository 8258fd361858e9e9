"""The CUDA attention path (trainer/flex_attention.py) and the backend choice (trainer/attention_backend.py),
as far as a CPU can check them.

The ancestor mask is built independently from the layout's parent pointers (test_packing.path_of):
the tile counts, the full/partial/empty tile classes, the mask_mod and the BlockMask's forward
(FlexAttention's eager implementation, float64 on CPU) are compared with it and with SDPA over that
dense mask. FlexAttention's backward and its compiled kernel need CUDA: not tested here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.forests import long_prefix_episode, random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from tests.learner.test_packing import path_of
from tests.learner.test_reference import controlled_batch, rows_of
from trainer import attention_backend
from trainer.attention import segment_attention
from trainer.attention_backend import (
    AttentionBackend,
    AttentionBackendError,
    choose_backend,
    learner_sdpa,
)
from trainer.flex_attention import (
    BLOCK,
    _ancestor_mask_mod,
    flex_plan,
    padded_ends,
    padded_length,
    tile_pair_counts,
)
from trainer.learner import Learner
from trainer.packing import layout


def forests():
    """Flat layouts of random forests, the controlled episode and a long shared prefix (tree + packed)."""
    long = long_prefix_episode(np.random.default_rng(1), "L", "g", 1.0, vocab=512, parent_tokens=300,
                               worker_tokens=150, workers=3)  # fmt: skip
    batches = [rows_of(random_batch(s, vocab=512, size=5)) for s in (0, 1, 2)]
    batches += [rows_of(controlled_batch(512)), rows_from_calls(long)]
    return [layout(rows, kind) for rows in batches for kind in ("tree", "packed")]


def dense_ancestors(flat, padded: int) -> torch.Tensor:
    """bool [padded, padded] from parent walks; a pad sees only itself."""
    n = flat.input_ids.size
    dense = torch.zeros(padded, padded, dtype=torch.bool)
    for q in range(n):
        dense[q, path_of(flat, q)] = True
    dense[range(n, padded), range(n, padded)] = True
    return dense


@pytest.mark.parametrize("flat", forests(), ids=lambda f: f"n{f.input_ids.size}")
def test_tiles_and_mask_mod_equal_the_dense_ancestor_mask(flat):
    n = flat.input_ids.size
    padded = padded_length(n)
    dense = dense_ancestors(flat, padded)
    ends = padded_ends(flat.subtree_end, padded)
    tiles = padded // BLOCK
    per_tile = dense.reshape(tiles, BLOCK, tiles, BLOCK).sum(dim=(1, 3)).numpy()  # [q tile, k tile]
    assert np.array_equal(tile_pair_counts(ends), per_tile)
    q = torch.arange(padded)[:, None]
    k = torch.arange(padded)[None, :]
    mask = _ancestor_mask_mod(torch.from_numpy(ends))(0, 0, q, k)
    assert torch.equal(mask, dense)


@pytest.mark.parametrize("flat", forests()[:4], ids=lambda f: f"n{f.input_ids.size}")
def test_block_mask_classifies_every_tile(flat):
    padded = padded_length(flat.input_ids.size)
    dense = dense_ancestors(flat, padded)
    tiles = padded // BLOCK
    per_tile = dense.reshape(tiles, BLOCK, tiles, BLOCK).sum(dim=(1, 3))
    mask = flex_plan(flat.subtree_end, torch.device("cpu")).block_mask
    classes = {"partial": (per_tile > 0) & (per_tile < BLOCK * BLOCK), "full": per_tile == BLOCK**2}
    for name, want in classes.items():
        num = mask.kv_num_blocks if name == "partial" else mask.full_kv_num_blocks
        idx = mask.kv_indices if name == "partial" else mask.full_kv_indices
        got = torch.zeros(tiles, tiles, dtype=torch.bool)
        for qt in range(tiles):
            got[qt, idx[0, 0, qt, : num[0, 0, qt]].long()] = True
        assert torch.equal(got, want), name


@pytest.mark.parametrize("flat", forests()[::3], ids=lambda f: f"n{f.input_ids.size}")
def test_flex_forward_equals_sdpa_under_the_dense_mask(flat):
    """FlexAttention's eager forward (float64, GQA 4/2 heads) through the learner's attention function."""
    n = flat.input_ids.size
    dense = dense_ancestors(flat, padded_length(n))[:n, :n]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True).transpose(1, 2)
    plan = flex_plan(flat.subtree_end, torch.device("cpu"))
    got, _ = segment_attention(None, q, k, v, None, flex_plan=plan)
    assert torch.allclose(got, want, atol=1e-12)


def test_padded_lengths_are_few_and_close():
    sizes = {padded_length(n) for n in range(16384, 32769)}
    assert len(sizes) <= 9  # one compiled kernel per size
    for n in (1, 127, 128, 129, 1000, 25210, 57978):
        p = padded_length(n)
        assert p >= n and p % BLOCK == 0
        assert p - n < max(BLOCK, n / 4)  # < 1/8 of the next power of two


# ---- which backend ------------------------------------------------------------------------------------


def test_backend_choice_by_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_backend(cpu) is AttentionBackend.SEGMENTS
    monkeypatch.setattr(attention_backend, "flex_available", lambda: True)
    assert choose_backend(cuda) is AttentionBackend.FLEX
    monkeypatch.setattr(attention_backend, "flex_available", lambda: False)
    assert choose_backend(cuda) is AttentionBackend.SEGMENTS  # no Triton: the bucketed path
    assert choose_backend(cuda, "segments") is AttentionBackend.SEGMENTS
    with pytest.raises(AttentionBackendError, match="no backward"):
        choose_backend(cpu, "flex")


def test_cuda_passes_never_allow_cudnn_or_efficient_attention():
    cuda = torch.backends.cuda
    before = cuda.cudnn_sdp_enabled(), cuda.mem_efficient_sdp_enabled()
    with learner_sdpa(torch.device("cuda")):
        assert not cuda.cudnn_sdp_enabled() and not cuda.mem_efficient_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.math_sdp_enabled()
    assert (cuda.cudnn_sdp_enabled(), cuda.mem_efficient_sdp_enabled()) == before


def test_cpu_learner_runs_segments_and_refuses_flex(small_model_dir):
    learner = Learner(small_model_dir, LearnerConfig(layout="tree"), device="cpu")
    assert learner.attention_backend is AttentionBackend.SEGMENTS
    learner.attention_backend = "flex"
    with pytest.raises(AttentionBackendError):
        learner.step(rows_of(controlled_batch(512)))
