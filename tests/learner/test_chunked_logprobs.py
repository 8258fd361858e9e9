"""Chunked logprobs (trainer/chunked_logprobs.py) against today's definition and a float64 reference.

Two references: trainer/logprobs.py `processed_logprobs` (the full-logits implementation the learner
used before, vLLM's recipe) and `reference_logprobs` below, written here in float64 numpy the
straightforward way (sort descending, keep while the mass of the strictly more likely tokens is
< top_p). Values and gradients (w.r.t. hidden states and the head weight) must agree; the kept
top-p sets must be identical; no tensor with a vocabulary-sized last dimension may be saved for
backward by the learner's scoring (the full-logits path saves several, which shows the check bites).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.forests import random_batch, with_mixed_sampling
from grove.learner_config import LearnerConfig
from tests.learner.test_reference import MIXED, controlled_batch, rows_of
from trainer import chunked_logprobs as chunked_module
from trainer.chunked_logprobs import chunk_rows, chunked_logprobs, plain_head, top_p_cut
from trainer.learner import load_policy, prepare_batch
from trainer.logprobs import processed_logprobs, top_p_mask
from trainer.scoring import score_tokens

CPU = torch.device("cpu")
TOP_PS = [1.0, 0.9, 0.5, 0.99, 0.2, 0.999]
TEMPS = [1.0, 0.5, 1.3, 0.7]


def reference_logprobs(logits: np.ndarray, tokens, temps, top_ps) -> np.ndarray:
    """float64, one row at a time: log_softmax over the top-p set of logits / T (all of them at p = 1)."""
    out = np.empty(len(tokens))
    for i, (row, tok, t, p) in enumerate(zip(logits.astype(np.float64), tokens, temps, top_ps, strict=True)):
        scaled = row / t
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass strictly more likely
        kept = np.zeros(row.size, dtype=bool)
        kept[order[(before < p) | (np.arange(row.size) == 0)]] = True
        kept |= p >= 1.0  # no top-p at all (vLLM skips the mask; a float64 sum can reach 1.0 early)
        if not kept[tok]:
            out[i] = -np.inf
            continue
        z = scaled[kept]
        out[i] = scaled[tok] - (z.max() + np.log(np.exp(z - z.max()).sum()))
    return out


def case(n: int, h: int, vocab: int, seed: int, spread: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, h, generator=g, dtype=torch.float64) * spread
    tokens = torch.randint(0, vocab, (n,), generator=g)
    temps = torch.tensor(TEMPS, dtype=torch.float64)[torch.randint(0, len(TEMPS), (n,), generator=g)]
    top_ps = torch.tensor(TOP_PS, dtype=torch.float64)[torch.randint(0, len(TOP_PS), (n,), generator=g)]
    # some tokens drawn from the head of their distribution, so top-p keeps them (finite logprobs)
    head = (hidden @ weight.T).argmax(-1)
    tokens = torch.where(torch.arange(n) % 2 == 0, head, tokens)
    return hidden, weight, tokens, temps, top_ps


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("rows", [1, 37, None])
def test_values_and_gradients_equal_the_full_logits_implementation(dtype, tol, rows):
    hidden, weight, tokens, temps, top_ps = case(300, 32, 3000, seed=0)
    h1, w1 = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    want = processed_logprobs(h1 @ w1.T, tokens, temperature=temps, top_p=top_ps)
    finite = torch.isfinite(want)
    assert 0 < int(finite.sum()) < want.numel()  # both kinds of token present
    grad_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=want.dtype)
    (want[finite] * grad_out[finite]).sum().backward()
    h2, w2 = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    got = chunked_logprobs(h2, w2, None, tokens, temperature=temps, top_p=top_ps, rows=rows)
    assert torch.equal(torch.isfinite(got), finite)  # the same top-p sets
    assert got.dtype == want.dtype
    (got[finite] * grad_out[finite]).sum().backward()
    scale = want[finite].detach().abs().max()
    assert float((got[finite] - want[finite]).detach().abs().max()) <= tol * float(scale)
    for a, b in ((h2.grad, h1.grad), (w2.grad, w1.grad)):
        assert float((a - b).norm() / b.norm()) <= tol


def test_gradient_through_a_token_outside_its_top_p_set_matches():
    """A -inf logprob still passes gradient to the kept logits (-g * softmax), as log_softmax does."""
    hidden, weight, tokens, temps, top_ps = case(64, 16, 500, seed=2)
    h1 = hidden.clone().requires_grad_()
    want = processed_logprobs(h1 @ weight.T, tokens, temperature=temps, top_p=top_ps)
    outside = ~torch.isfinite(want)
    assert outside.any()
    torch.autograd.backward(want[outside], torch.ones(int(outside.sum()), dtype=want.dtype))
    h2 = hidden.clone().requires_grad_()
    got = chunked_logprobs(h2, weight, None, tokens, temperature=temps, top_p=top_ps, rows=7)
    torch.autograd.backward(got[outside], torch.ones(int(outside.sum()), dtype=got.dtype))
    assert torch.allclose(h2.grad, h1.grad, atol=1e-12)


@pytest.mark.parametrize("vocab, spread", [(3000, 0.5), (3000, 0.02), (20000, 3.0)])
def test_float32_values_equal_an_independent_float64_reference(vocab, spread):
    """Peaked (spread 3), ordinary (0.5) and nearly flat (0.02: top_p 0.99 needs ~all tokens) rows."""
    hidden, weight, tokens, temps, top_ps = case(96, 32, vocab, seed=3, spread=spread)
    logits = (hidden @ weight.T).float()
    got = chunked_logprobs(
        hidden.float(), weight.float(), None, tokens, temperature=temps, top_p=top_ps, rows=40
    )
    want = reference_logprobs(logits.double().numpy(), tokens.numpy(), temps.numpy(), top_ps.numpy())
    assert np.array_equal(np.isfinite(want), torch.isfinite(got).numpy())
    fin = np.isfinite(want)
    assert np.abs(got.double().numpy()[fin] - want[fin]).max() <= 2e-5 * max(1.0, np.abs(want[fin]).max())


def test_top_p_cut_keeps_exactly_the_full_sort_mask():
    hidden, weight, _, temps, _ = case(200, 32, 4000, seed=4)
    scaled = (hidden @ weight.T).float() / temps.float().unsqueeze(-1)
    p = torch.tensor([0.05, 0.3, 0.7, 0.9, 0.95, 0.999, 0.9999], dtype=torch.float32).repeat(30)[:200]
    kept_full = ~top_p_mask(scaled, p)
    kept_cut = scaled >= top_p_cut(scaled, p).unsqueeze(-1)
    assert torch.equal(kept_cut, kept_full)


def test_top_p_sorts_only_a_candidate_set_and_top_p_one_never_sorts(monkeypatch):
    """Peaked rows: the candidate set stays at the first size; flat rows grow it to a full sort;
    top_p == 1 everywhere: no sort, no top-k at all."""
    sizes = []
    real_topk = torch.Tensor.topk

    def topk(self, k, *args, **kwargs):
        sizes.append(k)
        return real_topk(self, k, *args, **kwargs)

    def no_sort(*_a, **_k):
        raise AssertionError("a full sort ran")

    monkeypatch.setattr(torch.Tensor, "topk", topk)
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    monkeypatch.setattr(torch, "sort", no_sort)
    vocab = 5000
    peaked_h, peaked_w, tokens, temps, _ = case(50, 16, vocab, seed=5, spread=4.0)
    ones = torch.ones(50, dtype=torch.float64)
    chunked_logprobs(peaked_h, peaked_w, None, tokens, temperature=temps, top_p=ones)
    assert sizes == []
    chunked_logprobs(peaked_h, peaked_w, None, tokens, temperature=ones, top_p=0.9 * ones)
    assert sizes and max(sizes) == chunked_module.TOP_P_FIRST_K
    sizes.clear()
    flat_h, flat_w, *_ = case(50, 16, vocab, seed=5, spread=0.001)
    chunked_logprobs(flat_h, flat_w, None, tokens, temperature=ones, top_p=0.999 * ones)
    assert max(sizes) == vocab  # the candidate set grew until it was the whole vocabulary


def test_chunk_rows_bound_the_buffer_not_the_tokens():
    assert chunk_rows(151_936) * 151_936 * 4 <= chunked_module.CHUNK_BYTES
    assert chunk_rows(151_936) == chunk_rows(151_936)  # a constant: memory per token cannot grow
    assert chunk_rows(512) == chunked_module.CHUNK_MAX_ROWS


# ---- in the learner ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(small_model_dir):
    return load_policy(small_model_dir, CPU, trainable=True)


def _saved_shapes(fn) -> list[tuple[int, ...]]:
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


@pytest.mark.parametrize("layout", ["padded", "tree"])
def test_scoring_keeps_no_vocabulary_sized_tensor_for_backward(policy, layout):
    episodes = with_mixed_sampling(random_batch(2, vocab=policy.config.vocab_size, size=4), MIXED, 2)
    cfg = LearnerConfig(layout=layout)
    (mb,) = prepare_batch(rows_of(episodes), cfg).plan
    vocab = policy.config.vocab_size
    chunked = _saved_shapes(lambda: score_tokens(policy, mb, cfg, CPU))
    full = _saved_shapes(lambda: score_tokens(policy, mb, cfg, CPU, trusted=True))
    assert any(s and s[-1] == vocab for s in full)  # the full-logits path keeps [tokens, vocab]
    assert not any(s and s[-1] == vocab for s in chunked), [s for s in chunked if s and s[-1] == vocab]


@pytest.mark.parametrize("layout", ["padded", "packed", "tree"])
def test_learner_logprobs_equal_the_full_logits_path(policy, layout):
    episodes = with_mixed_sampling(controlled_batch(policy.config.vocab_size), MIXED, 4)
    cfg = LearnerConfig(layout=layout, micro_batch_tokens=80)
    for mb in prepare_batch(rows_of(episodes), cfg).plan:
        with torch.no_grad():
            got = score_tokens(policy, mb, cfg, CPU)
            want = score_tokens(policy, mb, cfg, CPU, trusted=True)
        fin = torch.isfinite(want)
        assert torch.equal(torch.isfinite(got), fin)
        assert float((got[fin] - want[fin]).abs().max()) <= 1e-5


def test_a_head_with_a_transform_after_it_is_scored_from_full_logits(small_model_dir):
    model = load_policy(small_model_dir, CPU, trainable=False)
    assert plain_head(model) is model.lm_head
    model.config.final_logit_softcapping = 30.0  # Gemma-style: logits = 30 tanh(head(h) / 30)
    assert plain_head(model) is None
