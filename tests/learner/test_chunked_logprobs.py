"""Chunked logprobs (trainer/chunked_logprobs.py) against today's definition and a float64 reference.

Two references: trainer/logprobs.py `processed_logprobs` (the full-logits implementation, vLLM's
recipe) and `reference_logprobs` below, written here in float64 numpy the straightforward way (sort
descending, keep while the mass of the strictly more likely tokens is < top_p). No tensor with a
vocabulary-sized last dimension may be saved for backward by the learner's scoring (the full-logits
path saves several, which shows the check bites).

Which comparisons are exact, and why the others hold on any CPU:
- **Same logits, exact.** `chunk_logits` makes the head matmul the chunked code makes (the same
  F.linear on the same rows of the same shape), so both sides see the same bits; the log_softmax
  reduces each row on its own, so values and kept sets must be identical (`torch.equal`). The two
  top-p algorithms sum the same probabilities in different orders (full sort vs candidates + the mass
  outside them), so `separated_top_p` moves each row's top_p to the middle between two cumulative
  masses: no sum lies within rounding of 1 - top_p, and the kept sets do not depend on summation order.
- **Gradients** sum [chunk, vocab] x [vocab, hidden] products and the chunks' weight gradients in
  another order than autograd over the full path does: norm-relative bound 1e-12 (float64) and 2e-5
  (float32), ~n u for the n <= 300 terms of a sum (u: the unit roundoff).
- **Other matmuls** (the float64 reference): logits differ by at most `logit_error_bound` (the
  classic gamma_h sum |h_k w_k| bound of a length-h dot product); `separated_top_p` also puts the
  boundary where neighbouring logits differ by more than twice that.
- **Deliberately different matmuls**: `shape_rounding_linear` is a BLAS that rounds each shape its own
  way (one ulp up for an odd number of rows); the chunked head must be exact under it too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.forests import random_batch, with_mixed_sampling
from grove.learner_config import LearnerConfig
from tests.learner.test_reference import MIXED, controlled_batch, rows_of, separated_sampling
from trainer import chunked_logprobs as chunked_module
from trainer.chunked_logprobs import chunk_rows, chunked_logprobs, plain_head, top_p_cut
from trainer.learner import load_policy, prepare_batch
from trainer.logprobs import processed_logprobs, top_p_cut_sorted
from trainer.scoring import score_tokens

CPU = torch.device("cpu")
TOP_PS = [1.0, 0.9, 0.5, 0.99, 0.2, 0.999]
TEMPS = [1.0, 0.5, 1.3, 0.7]
MASS_MARGIN = 1e-4  # 1 - top_p this far from every cumulative mass (float32 sums err by < 1e-5 here)


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


def logit_error_bound(hidden: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per row, the largest |fl(h . w_v) - h . w_v| a `dtype` matmul may make: gamma_h sum_k |h_k w_vk|."""
    h = hidden.shape[-1]
    u = torch.finfo(dtype).eps / 2
    return (h * u / (1 - h * u)) * (hidden.double().abs() @ weight.double().abs().T).max(-1).values


def separated_top_p(
    scaled: torch.Tensor, top_ps: torch.Tensor, gap: torch.Tensor | float = 0.0, margin: float = MASS_MARGIN
):
    """Each top_p < 1 moved to the middle between the two cumulative masses around the boundary
    (float64 scaled logits [N, V]), at the nearest boundary where the mass step is >= 2 `margin` and
    the kept and dropped logits differ by more than `gap` (per row, or 0: the same logits on both sides)."""
    out = top_ps.clone()
    probs, order = scaled.double().softmax(-1).sort(-1, descending=True)
    logits = scaled.double().gather(-1, order)
    mass = probs.cumsum(-1)  # mass[m - 1]: the top m tokens
    gaps = torch.as_tensor(gap, dtype=torch.float64).expand(scaled.shape[0])
    for i in torch.nonzero(top_ps < 1.0).squeeze(-1).tolist():
        m = int((mass[i] < top_ps[i]).sum()) + 1  # tokens kept at the original top_p
        for cand in sorted(range(1, scaled.shape[1]), key=lambda c: abs(c - m)):
            step_ok = probs[i, cand - 1] >= 2 * margin
            last = cand == scaled.shape[1]
            apart = gaps[i] == 0 or last or logits[i, cand - 1] - logits[i, cand] > 2 * gaps[i]
            if step_ok and apart:
                below = mass[i, cand - 2] if cand > 1 else 0.0
                out[i] = float(below + mass[i, cand - 1]) / 2
                break
        else:
            raise AssertionError(f"row {i}: no boundary separated enough; the test data cannot prove it")
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


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, rows: int, compute=None) -> torch.Tensor:
    """The head's logits as the chunked code computes them: one F.linear per chunk of `rows` rows."""
    compute = compute or weight.dtype
    out = torch.promote_types(compute, torch.float32)
    w = weight.to(compute)
    parts = [F.linear(hidden[s : s + rows].to(compute), w).to(out) for s in range(0, hidden.shape[0], rows)]
    return torch.cat(parts)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("rows", [1, 37, None])
def test_values_and_gradients_equal_the_full_logits_implementation(dtype, tol, rows):
    hidden, weight, tokens, temps, top_ps = case(300, 32, 3000, seed=0)
    rows_used = rows or chunk_rows(3000)
    h1, w1 = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    logits = chunk_logits(h1, w1, rows_used)  # the chunked code's own matmuls: the same bits
    top_ps = separated_top_p(logits.detach() / temps.unsqueeze(-1), top_ps)
    want = processed_logprobs(logits, tokens, temperature=temps, top_p=top_ps)
    finite = torch.isfinite(want)
    assert 0 < int(finite.sum()) < want.numel()  # both kinds of token present
    grad_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=want.dtype)
    (want[finite] * grad_out[finite]).sum().backward()
    h2, w2 = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    got = chunked_logprobs(h2, w2, None, tokens, temperature=temps, top_p=top_ps, rows=rows)
    assert got.dtype == want.dtype
    assert torch.equal(got.detach(), want.detach())  # the same logits: the same numbers, -inf included
    (got[finite] * grad_out[finite]).sum().backward()
    for a, b in ((h2.grad, h1.grad), (w2.grad, w1.grad)):
        assert float((a - b).norm() / b.norm()) <= tol


def shape_rounding_linear(real):
    """F.linear as a BLAS that blocks each shape differently: one ulp up when the row count is odd."""

    def linear(x, w, b=None):
        out = real(x, w, b)
        if out.shape[0] % 2 == 0:
            return out
        ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}
        bits = ints[out.dtype]
        step = torch.where(out >= 0, 1, -1).to(bits)  # toward +inf: magnitude up if >= 0, down if < 0
        return (out.contiguous().view(bits) + step).view(out.dtype)

    return linear


@pytest.mark.parametrize("compute", [torch.float64, torch.float32, torch.bfloat16])
def test_mixed_chunks_read_the_cut_from_their_own_matmul(monkeypatch, compute):
    """Greedy tokens (top_p 1e-6: only the top token kept) and tokens at top_p 0.7 in chunks of 8 beside
    top_p 1 tokens, under a BLAS whose rounding depends on the shape: a cut taken from another matmul
    than the log_softmax's would sit one ulp above the kept logit and mask it (-inf, NaN when it was
    the only one). Each chunk's values must be those of its own logits, gradients finite."""
    hidden, weight, _, temps, _ = case(64, 16, 800, seed=8, spread=1.0)
    # per chunk of 8: three top_p 1 rows beside five (odd) top_p < 1 rows
    top_ps = torch.tensor([1.0, 1e-6, 1.0, 1e-6, 1.0, 1e-6, 0.7, 0.7], dtype=torch.float64).repeat(8)
    weight = weight.to(compute).double()  # representable in every compute dtype
    head = chunk_logits(hidden, weight, 8, compute).argmax(-1)
    tokens = torch.where(top_ps < 0.01, head, head.flip(0))
    monkeypatch.setattr(F, "linear", shape_rounding_linear(F.linear))
    logits = chunk_logits(hidden, weight, 8, compute)  # even rows: what each chunk's one matmul gives
    greedy = top_ps < 0.01  # 1e-6: far below the top token's probability, nothing to separate
    top_ps = torch.where(greedy, top_ps, separated_top_p(logits / temps.unsqueeze(-1), top_ps))
    want = processed_logprobs(logits, tokens, temperature=temps, top_p=top_ps)
    h = hidden.clone().requires_grad_()
    got = chunked_logprobs(
        h, weight, None, tokens, temperature=temps, top_p=top_ps, compute_dtype=compute, rows=8
    )
    assert torch.equal(got.detach(), want)
    assert bool(torch.isfinite(got[greedy]).all())  # every greedy token kept
    got[torch.isfinite(got)].sum().backward()
    assert bool(torch.isfinite(h.grad).all())


def test_each_chunk_makes_one_head_matmul(monkeypatch):
    """Forward: one matmul per chunk, whatever mix of top_p it holds (the cut is read from it)."""
    hidden, weight, tokens, temps, top_ps = case(40, 16, 500, seed=9)
    calls = []
    real = F.linear

    def counting(x, w, b=None):
        calls.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(F, "linear", counting)
    with torch.no_grad():
        chunked_logprobs(hidden, weight, None, tokens, temperature=temps, top_p=top_ps, rows=16)
    assert calls == [16, 16, 8]


def test_gradient_through_a_token_outside_its_top_p_set_matches():
    """A -inf logprob still passes gradient to the kept logits (-g * softmax), as log_softmax does."""
    hidden, weight, tokens, temps, top_ps = case(64, 16, 500, seed=2)
    h1 = hidden.clone().requires_grad_()
    top_ps = separated_top_p(chunk_logits(hidden, weight, 7) / temps.unsqueeze(-1), top_ps)
    want = processed_logprobs(chunk_logits(h1, weight, 7), tokens, temperature=temps, top_p=top_ps)
    outside = ~torch.isfinite(want)
    assert outside.any()
    torch.autograd.backward(want[outside], torch.ones(int(outside.sum()), dtype=want.dtype))
    h2 = hidden.clone().requires_grad_()
    got = chunked_logprobs(h2, weight, None, tokens, temperature=temps, top_p=top_ps, rows=7)
    assert torch.equal(torch.isfinite(got), ~outside)
    torch.autograd.backward(got[outside], torch.ones(int(outside.sum()), dtype=got.dtype))
    assert torch.allclose(h2.grad, h1.grad, atol=1e-12)  # float64, same-shaped products (see above)


@pytest.mark.parametrize("vocab, spread", [(3000, 0.5), (3000, 0.02), (20000, 3.0)])
def test_float32_values_equal_an_independent_float64_reference(vocab, spread):
    """Peaked (spread 3), ordinary (0.5) and nearly flat (0.02: top_p 0.99 needs ~all tokens) rows.

    The float32 matmul's logits differ from the float64 ones by at most `logit_error_bound` (divided by
    T, at most 2x here): the boundaries are put where neighbouring logits differ by more than twice
    that, so the kept sets are the same on any CPU; values within 2e-5 (float32 log_softmax)."""
    hidden, weight, tokens, temps, top_ps = case(96, 32, vocab, seed=3, spread=spread)
    logits = (hidden @ weight.T).float()
    bound = logit_error_bound(hidden.float(), weight.float(), torch.float32)
    error = 2 * (bound + 1e-6 * logits.abs().max(-1).values)  # + rounding the float64 logits to float32
    top_ps = separated_top_p(logits.double() / temps.unsqueeze(-1), top_ps, gap=error / temps)
    got = chunked_logprobs(
        hidden.float(), weight.float(), None, tokens, temperature=temps, top_p=top_ps, rows=40
    )
    want = reference_logprobs(logits.double().numpy(), tokens.numpy(), temps.numpy(), top_ps.numpy())
    assert np.array_equal(np.isfinite(want), torch.isfinite(got).numpy())
    fin = np.isfinite(want)
    assert np.abs(got.double().numpy()[fin] - want[fin]).max() <= 2e-5 * max(1.0, np.abs(want[fin]).max())


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_top_p_cut_equals_the_full_sort_rule(compute):
    """The candidate search and trainer/logprobs.py's full sort give the same cut and tie weight on
    the same logits (bf16: many ties at the cut)."""
    hidden, weight, _, temps, _ = case(200, 32, 4000, seed=4)
    scaled = chunk_logits(hidden, weight, 200, compute).float() / temps.float().unsqueeze(-1)
    p = torch.tensor([0.05, 0.3, 0.7, 0.9, 0.95, 0.999, 0.9999], dtype=torch.float64).repeat(30)[:200]
    p = separated_top_p(scaled, p).float()
    full, cut = top_p_cut_sorted(scaled, p), top_p_cut(scaled, p)
    assert torch.equal(cut.value, full.value) and torch.equal(cut.tie, full.tie)
    if compute == torch.bfloat16:
        assert int((full.tie != 0).sum()) > 20  # ties at the cut, a part of them kept, are common


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
    """The chunked head in the learner against the reference computations (full logits, float32,
    SDPA MATH): other kernels, so logits differ by float32 rounding (~1e-6 relative); each call's top_p
    is moved off its boundaries (tests/learner/test_reference.py `separated_sampling`: 100x that), so
    the kept sets are equal on any CPU, and values within 1e-5 (a few float32 ulps of logprobs <= 20)."""
    episodes = separated_sampling(
        policy, with_mixed_sampling(controlled_batch(policy.config.vocab_size), MIXED, 4)
    )
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
