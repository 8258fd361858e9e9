"""Independent reference for engine logprobs: one plain transformers forward pass, in float64 softmax."""

from __future__ import annotations

import torch


def hf_sampled_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of the raw logits at each completion position, gathered at the sampled token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(completion))
    return logp[positions, torch.tensor(completion)]
