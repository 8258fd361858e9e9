"""Sampler-processed logprobs from hidden states, in chunks of tokens: no [tokens, vocab] logits kept.

trainer/logprobs.py is the definition (vLLM's processed logprobs: float32 logits / the token's
temperature, vLLM's top-p mask, log_softmax); this module computes the same numbers with memory that
does not grow with tokens x vocabulary:

- **Chunks.** The LM head is applied to `chunk_rows(vocab)` scored tokens at a time (a [chunk, vocab]
  float32 buffer of at most `CHUNK_BYTES`), inside one autograd Function that keeps only the hidden
  states it was given, the head weight (a parameter, already held) and three float32 numbers per
  token (its temperature, its top-p cut and the cut's tie weight). Each chunk makes **one** head
  matmul, and the top-p cut is read from that very tensor before its log_softmax: a cut taken from
  another matmul (the top_p < 1 rows alone, say) can differ from it in the last bit, because a BLAS
  blocks and rounds each shape its own way, and a cut one bit above the kept token's logit masks it
  (-inf, or NaN when it was the only one kept, as a greedy token at a tiny top_p is). Backward
  recomputes the chunk's logits with the same call on the same rows, and applies d logp / d logits =
  (onehot - softmax over the kept set) / T, then the head's two matmuls.
  Per scored token the step keeps O(hidden) bytes, whatever the vocabulary.
- **Top-p without a full sort.** A token with top_p == 1 is never sorted (vLLM skips the mask too).
  For top_p < 1 the kept set is the smallest suffix of the ascending order whose cumulative mass
  exceeds 1 - top_p (vLLM: `cumsum(sorted ascending) <= 1 - p` is masked, the top token always
  kept). It is found among the `TOP_P_FIRST_K` most likely tokens, the candidate set growing x4 until
  its least likely member is itself masked (then every token below it is too, and the mask is
  decided): the cumulative sums are the candidates' ascending sums plus the exact mass of every
  token outside them. A set that never closes ends as a full sort (k = vocab). The kept set is then
  stored as a cut on the scaled logit and the tie weight of the tokens equal to it (trainer/logprobs.py
  `TopPCut`: vLLM's tie rule, whichever tied tokens the engine's sort kept), so backward needs no mask.

Given the same logits, the values are trainer/logprobs.py's bit for bit and the kept sets are the
same, unless a cumulative sum lies within rounding of 1 - top_p (the two sum the same probabilities in
another order); from different matmuls (another chunking, the full [tokens, vocab] product) the logits
themselves differ in the last bits (tests: tests/learner/test_chunked_logprobs.py, which says which
comparison is exact and which bound applies). Matmuls run in `compute_dtype` (bf16 under CUDA
autocast, as the model's own LM head would), the softmax in float32 (float64 for a float64 model).

`logprob_head(model, ...)` makes a Hugging Face causal LM return these logprobs instead of logits:
its LM head's forward is replaced for the duration of one call, so the model's own forward (and
FSDP's hooks around it) run unchanged and the head's weight is used where the model uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.logprobs import TopPCut, apply_cut_, tie_log_weight, token_tie_weight

CHUNK_BYTES = 256 * 2**20  # one float32 [chunk, vocab] buffer; backward holds ~4 of them at once
CHUNK_MAX_ROWS = 512  # small vocabularies: beyond this a bigger chunk saves nothing measurable
TOP_P_FIRST_K = 64  # first candidate set for top-p; grows x4 until it decides the mask
# Models whose logits are not `lm_head(hidden)` (a transform after the head): scored from full logits.
HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunk_rows(vocab: int) -> int:
    """Scored tokens per chunk: a float32 [rows, vocab] buffer of at most CHUNK_BYTES."""
    return max(1, min(CHUNK_MAX_ROWS, CHUNK_BYTES // (4 * vocab)))


def top_p_cut(scaled: Tensor, top_p: Tensor, first_k: int = TOP_P_FIRST_K) -> TopPCut:
    """Per row, vLLM's top-p cut of scaled logits [R, V] (trainer/logprobs.py `TopPCut`, ties
    included) without a full sort (module docstring). Float32 (float64) like `scaled`."""
    r, vocab = scaled.shape
    probs = scaled.softmax(dim=-1)
    value = torch.empty(r, dtype=scaled.dtype, device=scaled.device)
    kept_at_cut = torch.empty(r, dtype=torch.long, device=scaled.device)
    todo = torch.arange(r, device=scaled.device)
    k = min(first_k, vocab)
    while todo.numel():
        p, pr = top_p[todo], probs[todo]
        vals, idx = pr.topk(k, dim=-1)  # descending
        outside = pr.scatter(-1, idx, 0.0).sum(-1)  # the exact mass of every non-candidate
        ascending = vals.flip(-1)
        masked = outside.unsqueeze(-1) + ascending.cumsum(-1) <= (1 - p).unsqueeze(-1)
        masked[:, -1] = False  # the most likely token always survives
        done = masked[:, 0] if k < vocab else torch.ones_like(masked[:, 0])
        kept = (~masked).sum(-1)  # kept candidates: the top `kept` of the descending list
        candidates = scaled[todo.unsqueeze(-1), idx]  # [rows, k]: no copy of the whole rows
        cut = candidates.gather(-1, (kept - 1).unsqueeze(-1))  # the least likely kept token's logit
        in_kept = torch.arange(k, device=scaled.device) < kept.unsqueeze(-1)
        at_cut = ((candidates == cut) & in_kept).sum(-1)
        value[todo[done]] = cut.squeeze(-1)[done]
        kept_at_cut[todo[done]] = at_cut[done]
        todo = todo[~done]
        k = min(4 * k, vocab)
    return TopPCut(value, tie_log_weight(scaled, value, kept_at_cut))


@dataclass(frozen=True)
class _Chunking:
    compute_dtype: torch.dtype  # the LM head matmul's dtype (bf16 under autocast)
    out_dtype: torch.dtype  # float32, or float64 for a float64 model
    rows: int


def _scaled(h: Tensor, w: Tensor, b: Tensor | None, temperature: Tensor, ch: _Chunking) -> Tensor:
    """h W^T / T of one chunk [rows, V]: its one matmul (forward and backward make the same call)."""
    return F.linear(h.to(ch.compute_dtype), w, b).to(ch.out_dtype).div_(temperature.unsqueeze(-1))


def _chunk_cut(scaled: Tensor, top_p: Tensor) -> TopPCut:
    """The chunk's top-p cut, read from the very logits its log_softmax uses (rows with top_p < 1)."""
    cut = TopPCut.none(scaled.shape[0], scaled.dtype, scaled.device)
    rows = torch.nonzero(top_p < 1.0).squeeze(-1)
    if rows.numel():
        part = top_p_cut(scaled[rows], top_p[rows])
        cut.value[rows], cut.tie[rows] = part.value, part.tie
    return cut


def _chunk_logprobs(hidden, w, b, tokens, temperature, top_p, ch: _Chunking) -> tuple[Tensor, TopPCut]:
    """One chunk's (logprob of its tokens [rows], top-p cut); its [rows, V] buffers die on return,
    so the next chunk's never coexist with them."""
    scaled = _scaled(hidden, w, b, temperature, ch)
    cut = _chunk_cut(scaled, top_p)
    own = token_tie_weight(scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), cut)
    logp = apply_cut_(scaled, cut).log_softmax(dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - own, cut


def _chunk_grad(hidden, w, b, tokens, temperature, cut: TopPCut, grad, ch: _Chunking) -> Tensor:
    """d loss / d logits of one chunk [rows, V] in the head's compute dtype."""
    logp = apply_cut_(_scaled(hidden, w, b, temperature, ch), cut).log_softmax(dim=-1)
    # d logp[token] / d scaled = onehot(token) - softmax (0 outside the kept set, and no onehot for a
    # token outside it: its -inf logprob is constant there)
    g = grad.to(ch.out_dtype).unsqueeze(-1)
    tok = tokens.unsqueeze(-1)
    kept = torch.isfinite(logp.gather(-1, tok))
    d = logp.exp_().mul_(-g)
    d.scatter_add_(-1, tok, torch.where(kept, g, torch.zeros_like(g)))
    return d.div_(temperature.unsqueeze(-1)).to(ch.compute_dtype)


def _add_product(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b, in place when the dtypes allow (no [V, H] temporary)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc += (a @ b).to(acc.dtype)


class _ChunkedLogprobs(torch.autograd.Function):
    """logp[i] = log_softmax(top_p(h[i] W^T / T[i]))[token[i]], chunk by chunk (module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, top_p, chunking: _Chunking):
        w = weight.to(chunking.compute_dtype)
        b = None if bias is None else bias.to(chunking.compute_dtype)
        n = hidden.shape[0]
        out = torch.empty(n, dtype=chunking.out_dtype, device=hidden.device)
        cut, tie = torch.empty_like(out), torch.empty_like(out)
        for s in range(0, n, chunking.rows):
            e = min(n, s + chunking.rows)
            out[s:e], part = _chunk_logprobs(
                hidden[s:e], w, b, tokens[s:e], temperature[s:e], top_p[s:e], chunking
            )
            cut[s:e], tie[s:e] = part.value, part.tie
        ctx.save_for_backward(hidden, weight, bias, tokens, temperature, cut, tie)
        ctx.chunking = chunking
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, tokens, temperature, cut, tie = ctx.saved_tensors
        ch: _Chunking = ctx.chunking
        w = weight.to(ch.compute_dtype)
        b = None if bias is None else bias.to(ch.compute_dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros_like(weight) if need_w else None
        db = torch.zeros_like(bias) if need_b else None
        n = hidden.shape[0]
        for s in range(0, n, ch.rows):
            e = min(n, s + ch.rows)
            h = hidden[s:e].to(ch.compute_dtype)
            chunk_cut = TopPCut(cut[s:e], tie[s:e])
            d = _chunk_grad(h, w, b, tokens[s:e], temperature[s:e], chunk_cut, grad[s:e], ch)
            if need_h:
                dh[s:e] = (d @ w).to(hidden.dtype)
            if need_w:
                _add_product(dw, d.t(), h)
            if need_b:
                db += d.sum(0).to(bias.dtype)
            del d
        return dh, dw, db, None, None, None, None


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    *,
    temperature: Tensor,
    top_p: Tensor,
    compute_dtype: torch.dtype | None = None,
    rows: int | None = None,
) -> Tensor:
    """Processed logprob of each token from the hidden state that predicts it.

    Args:
        hidden: [N, H] final hidden states (after the model's last norm), one per scored token.
        weight, bias: the LM head ([V, H], [V] or None).
        tokens: int64 [N]; temperature, top_p: [N] (any float dtype; cast like trainer/logprobs.py).
        compute_dtype: the head matmul's dtype (default: the weight's).
        rows: tokens per chunk (default `chunk_rows(V)`).

    Returns: float32 [N] (float64 for a float64 head); -inf for a token outside its top-p set.
    """
    compute = weight.dtype if compute_dtype is None else compute_dtype
    out_dtype = torch.promote_types(compute, torch.float32)
    chunking = _Chunking(compute, out_dtype, rows or chunk_rows(weight.shape[0]))
    return _ChunkedLogprobs.apply(
        hidden, weight, bias, tokens, temperature.to(out_dtype), top_p.to(out_dtype), chunking
    )


def plain_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when its logits are exactly `head(hidden)`; None otherwise."""
    head = model.get_output_embeddings()  # type: ignore[operator]  # a transformers method (nn.Module types it as a tensor)
    if not isinstance(head, nn.Linear):
        return None
    config = model.config
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in HEAD_TRANSFORMS):
        return None
    return head


@dataclass(frozen=True)
class ScoredTokens:
    """Which positions of the head's input score which token, under which processing."""

    rows: Tensor  # int64 [N]: batch index into the head's input [B, T', H]
    positions: Tensor  # int64 [N]: position index into it
    tokens: Tensor  # int64 [N]
    temperature: Tensor  # [N]
    top_p: Tensor  # [N]


@contextmanager
def logprob_head(model: nn.Module, scored: ScoredTokens) -> Iterator[bool]:
    """While open, `model(...)` returns processed logprobs [N] as its `.logits` (yields True), or the
    model is left alone when its head is not a plain linear map (yields False: score full logits)."""
    head = plain_head(model)
    if head is None:
        yield False
        return

    def forward(hidden: Tensor) -> Tensor:  # [B, T', H], what the model would have fed the head
        device_type = hidden.device.type
        compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        h = hidden[scored.rows, scored.positions]
        return chunked_logprobs(
            h, head.weight, head.bias, scored.tokens, temperature=scored.temperature, top_p=scored.top_p,
            compute_dtype=compute,
        )  # fmt: skip

    head.forward = forward  # type: ignore[assignment]  # an instance attribute shadows nn.Linear.forward for this call only
    try:
        yield True
    finally:
        del head.forward
