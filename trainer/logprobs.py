"""Token log-probabilities exactly as the sampler reports them (vLLM `logprobs_mode="processed_logprobs"`).

The importance ratio exp(logp - behaviour_logp) is only 1 on-policy if the learner scores tokens
with the same processing the sampler applied before sampling. vLLM's processed logprobs are
log_softmax of float32 logits divided by the temperature, with the top-p mask applied as in
`vllm/v1/sample/ops/topk_topp_sampler.py: apply_top_k_top_p_pytorch`: sort ascending, cumulative
probabilities, drop every token whose cumulative sum is <= 1 - top_p, always keep the most likely
one, masked logits set to -inf. vLLM skips the mask entirely when top_p == 1, and so do we.
Measured on this machine: processed logprobs match this recipe to 1.4e-6 (shared/research/vllm_cpu.md).
"""

from __future__ import annotations

import torch
from torch import Tensor


def top_p_mask(scaled: Tensor, top_p: float) -> Tensor:
    """Tokens removed by top-p: scaled logits float [N, V] -> bool [N, V] (True = masked)."""
    sorted_logits, order = scaled.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    masked_sorted = cumulative <= 1 - top_p
    masked_sorted[:, -1] = False  # the most likely token always survives
    return torch.zeros_like(masked_sorted).scatter(-1, order, masked_sorted)


def processed_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float, top_p: float) -> Tensor:
    """Sampler-processed log-probability of each token.

    Args:
        logits: float [N, V], the logits that predicted each token (position t-1 for token t).
        tokens: int64 [N], the tokens scored.
        temperature: the sampler's temperature (> 0).
        top_p: the sampler's top-p in (0, 1].

    Returns:
        float32 [N]; -inf for a token outside the current top-p set.
    """
    # float32 at least, like vLLM's sampler (bf16 logits are upcast); float64 stays float64 (tests).
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if top_p < 1.0:
        with torch.no_grad():
            mask = top_p_mask(scaled.detach(), top_p)
        scaled = scaled.masked_fill(mask, float("-inf"))
    return scaled.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
