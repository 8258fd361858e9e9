"""Ties at the top-p cut: the learner keeps vLLM's count of tied tokens, each at weight k / n
(trainer/logprobs.py, "Ties at the cut"), so every token the engine kept scores what vLLM recorded.

The engine's side is vLLM's own code, called here: `apply_top_k_top_p_pytorch` (the sampler's top-p
on CPU; `torch.sort` there is not stable, so which tied tokens it keeps is arbitrary), then
`log_softmax` as `TopKTopPSampler.forward_cpu` computes processed logprobs. Both sides are given the
same float32 logits, so the only differences are the float32 rounding of the two normalisers (the k
kept tied logits summed by vLLM, n logits at log-weight log(k / n) by the learner): 1e-5 absolute
bounds a few ulps of logprobs of magnitude <= 30.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.learner.test_chunked_logprobs import case, chunk_logits, separated_top_p
from trainer.chunked_logprobs import chunked_logprobs
from trainer.logprobs import apply_cut, processed_logprobs, top_p_cut_sorted

TOL = 1e-5


def vllm_processed(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """vLLM's processed logprobs [N, V] (-inf outside its kept set) of float32 scaled logits."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    masked = apply_top_k_top_p_pytorch(logits.clone(), None, top_p.float(), allow_cpu_sync=True)
    return masked.log_softmax(dim=-1, dtype=torch.float32)


def learner_all(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The learner's processed logprob of every token of every row [N, V] (trainer/logprobs.py)."""
    n, v = logits.shape
    tokens = torch.arange(v).repeat(n)
    rows = logits.repeat_interleave(v, dim=0)
    return processed_logprobs(rows, tokens, temperature=1.0, top_p=top_p.repeat_interleave(v)).view(n, v)


def learner_rows(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The same for large vocabularies, from trainer/logprobs.py's parts (all top_p < 1)."""
    cut = top_p_cut_sorted(scaled, top_p)
    own = torch.where(scaled == cut.value.unsqueeze(-1), cut.tie.unsqueeze(-1), 0.0)
    return apply_cut(scaled, cut).log_softmax(-1) - own


def test_a_tie_group_straddling_the_cut_by_hand():
    """Logits 3, five tokens at 1, then 0 and -1; top_p 0.75 masks the two least likely and two of the
    five tied tokens (ascending cumulative sums 0.010, 0.039, 0.117, 0.194 <= 0.25; 0.272 > 0.25): vLLM
    keeps 3 of the 5. Every tied token scores 1 - log(e^3 + 3e); under any order of the token ids,
    vLLM keeps 3 of them, and each it keeps has that logprob."""
    base = torch.tensor([3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, -1.0])
    tied = 1.0 - math.log(math.exp(3) + 3 * math.exp(1))
    top = 3.0 - math.log(math.exp(3) + 3 * math.exp(1))
    p = torch.tensor([0.75])
    for seed in range(8):
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed))
        logits = base[perm].unsqueeze(0)
        ours = learner_all(logits, p)[0]
        want = torch.tensor([top, *[tied] * 5, -math.inf, -math.inf])[perm]
        assert torch.allclose(ours, want.float(), atol=1e-6), (seed, ours, want)
        engine = vllm_processed(logits, p)[0]
        kept = torch.isfinite(engine)
        assert int(kept.sum()) == 4  # the top token and 3 of the 5 tied ones
        assert torch.allclose(ours[kept], engine[kept], atol=1e-6)
        chunked = chunked_logprobs(
            logits.repeat(8, 1).contiguous(), torch.eye(8), None, torch.arange(8),
            temperature=torch.ones(8), top_p=p.repeat(8),
        )  # fmt: skip
        assert torch.equal(chunked, ours)  # the identity head: the same logits, the same numbers


def test_bf16_head_ties_score_what_vllm_recorded():
    """A bf16 head over a 32k vocabulary at top_p 0.5 and 0.7: the cut falls inside a group of tied
    logits in most rows and vLLM keeps part of it. For every token vLLM kept, the learner (both paths)
    gives vLLM's logprob; no token tied at the cut is -inf.

    Both sides sum the same float32 probabilities in other orders (vLLM: softmax of the sorted row,
    cumsum; the learner: candidates plus the mass outside them), a difference of the order of
    sqrt(V) u ~ 1e-5 for V = 32k: each 1 - top_p is put >= 2e-5 from every cumulative sum."""
    hidden, weight, _, temps, _ = case(64, 64, 32_000, seed=12, spread=0.3)
    logits = chunk_logits(hidden, weight, 64, torch.bfloat16).float()  # what the chunked head computes
    scaled = logits / temps.float().unsqueeze(-1)
    top_p = torch.tensor([0.5, 0.7], dtype=torch.float64).repeat(32)
    top_p = separated_top_p(scaled, top_p, margin=2e-5).float()
    engine = vllm_processed(scaled, top_p)
    kept = torch.isfinite(engine)
    cut = scaled.masked_fill(~kept, math.inf).min(-1).values
    at_cut = scaled == cut.unsqueeze(-1)
    partly = (at_cut & ~kept).any(-1)
    assert int(partly.sum()) >= 20, "the bf16 case must put ties across the cut in most rows"
    ours = learner_rows(scaled, top_p)
    assert torch.equal(torch.isfinite(ours), kept | at_cut)
    assert float((ours[kept] - engine[kept]).abs().max()) <= TOL
    # the chunked head on the sampled tokens: a tied token vLLM did NOT keep, when a row has one
    tokens = torch.where(partly, (at_cut & ~kept).float().argmax(-1), engine.argmax(-1))
    got = chunked_logprobs(
        hidden.float(), weight.float(), None, tokens, temperature=temps.float(), top_p=top_p,
        compute_dtype=torch.bfloat16, rows=64,
    )  # fmt: skip
    want = ours.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(got, want)  # the same logits: bit for bit
    assert torch.equal(processed_logprobs(logits, tokens, temperature=temps.float(), top_p=top_p), want)
    # whichever tied tokens vLLM's sort kept, each scores what our tied tokens score
    tied_value = engine.masked_fill(~(kept & at_cut), math.nan).nanmean(-1)
    assert float((got[partly] - tied_value[partly]).abs().max()) <= TOL


@pytest.mark.parametrize("top_p", [1e-6, 0.3])
def test_ties_at_the_top_share_the_kept_count(top_p):
    """Two tokens tie for the most likely: a tiny top_p keeps one of them (vLLM: whichever its sort
    puts last), the learner both at weight 1/2, each scoring log(e^2 / e^2) = 0 like vLLM's kept one."""
    logits = torch.tensor([[2.0, 0.5, 2.0, -1.0]])
    p = torch.tensor([top_p])
    ours = learner_all(logits, p)[0]
    engine = vllm_processed(logits, p)[0]
    assert int(torch.isfinite(engine).sum()) == 1
    assert ours[0] == ours[2] == engine[torch.isfinite(engine)][0] == 0.0
    assert torch.isinf(ours[1]) and torch.isinf(ours[3])
