"""Token log-probabilities exactly as the sampler reports them (vLLM `logprobs_mode="processed_logprobs"`).

The importance ratio exp(logp - behaviour_logp) is only 1 on-policy if the learner scores tokens
with the same processing the sampler applied before sampling. vLLM's processed logprobs are
log_softmax of float32 logits divided by the temperature, with the top-p mask applied as in
`vllm/v1/sample/ops/topk_topp_sampler.py: apply_top_k_top_p_pytorch`: sort ascending, cumulative
probabilities, drop every token whose cumulative sum is <= 1 - top_p, always keep the most likely
one, masked logits set to -inf. vLLM skips the mask entirely when top_p == 1, and so do we.
vLLM-CPU's processed logprobs are computed this way: tests/inference/test_engine.py checks that the
engine's recorded behaviour logprobs equal this recipe's (`test_behaviour_logprobs_equal_the_learners`).

**Ties at the cut.** When several tokens share the scaled logit of the least likely kept token (the
usual case with a bf16 head: its logits take few distinct values), vLLM's rule decides how many of
them are kept (the cumulative sums step through them one probability at a time), but *which* ones
is left to the order its sort gives equal values: the CPU path's `torch.sort` is not stable (the
order is arbitrary, though repeatable), the GPU Triton kernel keeps the lowest token ids. The
learner does not guess an order. Of the n tokens tied at the cut, vLLM keeps k; the learner keeps
all n, each at weight k / n (a log-weight log(k / n) added to its logit before the log_softmax):

- the normaliser is vLLM's exactly (n tokens of weight k/n carry the mass of k of them), so the
  logprob of every kept token, and of a tied token whichever k the engine kept, is the one vLLM
  recorded when it sampled it;
- the gradient is the average over the tie orders (each tied token's softmax share is k/n of one);
- a tied token is never -inf: the engine may have kept and sampled any of them.
Without ties k = n = 1 and this is vLLM's mask. tests/learner/test_top_p_ties.py compares with
vLLM's own `apply_top_k_top_p_pytorch` under permuted token ids.

The processing is per token, never per run: every call may sample with its own temperature/top_p
(a gateway request's overrides), recorded in its receipt and its row span (grove/sampling.py).
`processed_logprobs` therefore takes either one value for all tokens or one value per token
(float tensors [N]), and applies each token's own values in one vectorised pass, like vLLM's sampler
does for a batch of requests with different settings: temperatures are float32 tensors dividing
float32 logits (`logits.div_(temp.unsqueeze(1))`), the top-p threshold is `1 - p` in float32.
One detail of vLLM cannot be mirrored and does not matter: when an engine batch mixes top_p < 1 with
top_p == 1 requests, vLLM masks the top_p == 1 rows too, at threshold 0, which removes only tokens
whose float32 probability is exactly 0 (never sampled, their recorded logprob never used). We mask
only the rows with top_p < 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TopPCut:
    """Per row, what vLLM's top-p rule keeps: every token with scaled logit > `value`, and the tokens
    equal to it at log-weight `tie` (log(k / n), module docstring; 0 without ties). [R] each."""

    value: Tensor
    tie: Tensor

    @staticmethod
    def none(rows: int, dtype: torch.dtype, device: torch.device) -> TopPCut:
        """No mask (top_p == 1): every token kept at weight 1."""
        return TopPCut(
            torch.full((rows,), float("-inf"), dtype=dtype, device=device),
            torch.zeros(rows, dtype=dtype, device=device),
        )


def _per_token(value: float | Tensor, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`value` as a [n] tensor of `dtype` (float32 like vLLM's sampling tensors, or float64 in tests)."""
    t = torch.as_tensor(value, dtype=dtype, device=device)
    return t.expand(n) if t.ndim == 0 else t


def tie_log_weight(scaled: Tensor, cut: Tensor, kept_at_cut: Tensor) -> Tensor:
    """log(k / n) per row: k tokens at the cut kept by the rule, n tokens of the row equal to the cut."""
    tied = (scaled == cut.unsqueeze(-1)).sum(-1)
    return (kept_at_cut.to(scaled.dtype) / tied.to(scaled.dtype)).log()


def top_p_cut_sorted(scaled: Tensor, top_p: float | Tensor) -> TopPCut:
    """vLLM's top-p rule on scaled logits [R, V] by a full ascending sort (the definition)."""
    p = _per_token(top_p, scaled.shape[0], scaled.dtype, scaled.device)
    sorted_logits, _ = scaled.sort(dim=-1, descending=False)  # ties in any order: only counts are used
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    masked = cumulative <= (1 - p).unsqueeze(-1)  # a prefix: the cumulative sums never decrease
    masked[:, -1] = False  # the most likely token always survives
    first = masked.sum(-1, keepdim=True)  # position of the least likely kept token
    cut = sorted_logits.gather(-1, first).squeeze(-1)
    kept_at_cut = ((sorted_logits == cut.unsqueeze(-1)) & ~masked).sum(-1)
    return TopPCut(cut, tie_log_weight(scaled, cut, kept_at_cut))


def apply_cut(scaled: Tensor, cut: TopPCut) -> Tensor:
    """Scaled logits [R, V] as the log_softmax sees them: -inf below the cut (masked_fill, so no
    gradient reaches a masked logit), + the tie log-weight at it, unchanged above it. Out of place."""
    value = cut.value.unsqueeze(-1)
    with torch.no_grad():
        below = scaled < value
        ties = torch.where(scaled == value, cut.tie.unsqueeze(-1), torch.zeros_like(cut.tie).unsqueeze(-1))
    return scaled.masked_fill(below, float("-inf")) + ties


def apply_cut_(scaled: Tensor, cut: TopPCut) -> Tensor:
    """`apply_cut` in place, for a tensor outside autograd (the chunked head): the same values."""
    value = cut.value.unsqueeze(-1)
    scaled.masked_fill_(scaled < value, float("-inf"))
    rows = torch.nonzero(cut.tie != 0).squeeze(-1)  # rows with ties at the cut (few in float32)
    if rows.numel():
        part = scaled[rows]
        scaled[rows] = torch.where(part == value[rows], part + cut.tie[rows].unsqueeze(-1), part)
    return scaled


def token_tie_weight(scaled_token: Tensor, cut: TopPCut) -> Tensor:
    """The log-weight a token's logit carried in the log_softmax ([N]): removed from its logprob."""
    return torch.where(scaled_token == cut.value, cut.tie, torch.zeros_like(cut.tie))


def top_p_mask(scaled: Tensor, top_p: float | Tensor) -> Tensor:
    """Tokens at weight 0 under top-p: scaled logits [N, V], top_p scalar or [N] -> bool [N, V] (True:
    masked)."""
    return scaled < top_p_cut_sorted(scaled, top_p).value.unsqueeze(-1)


def processed_logprobs(
    logits: Tensor, tokens: Tensor, *, temperature: float | Tensor, top_p: float | Tensor
) -> Tensor:
    """Sampler-processed log-probability of each token, each under its own temperature and top-p.

    Args:
        logits: float [N, V], the logits that predicted each token (position t-1 for token t).
        tokens: int64 [N], the tokens scored.
        temperature: the sampler's temperature (> 0): one float for all tokens, or float [N].
        top_p: the sampler's top-p in (0, 1]: one float for all tokens, or float [N].

    Returns:
        float32 [N] (float64 for float64 logits); -inf for a token outside its current top-p set.
    """
    # float32 at least, like vLLM's sampler (bf16 logits are upcast); float64 stays float64 (tests).
    dtype = torch.promote_types(logits.dtype, torch.float32)
    n = logits.shape[0]
    temp = _per_token(temperature, n, dtype, logits.device)
    p = _per_token(top_p, n, dtype, logits.device)
    scaled = logits.to(dtype) / temp.unsqueeze(-1)
    cut = TopPCut.none(n, dtype, logits.device)
    rows = torch.nonzero(p < 1.0).squeeze(-1)  # rows whose sampler applied a top-p mask
    if rows.numel():
        with torch.no_grad():
            part = top_p_cut_sorted(scaled.detach()[rows], p[rows])
            cut.value[rows], cut.tie[rows] = part.value, part.tie
    with torch.no_grad():
        own = token_tie_weight(scaled.detach().gather(-1, tokens.unsqueeze(-1)).squeeze(-1), cut)
    logp = apply_cut(scaled, cut).log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logp - own
