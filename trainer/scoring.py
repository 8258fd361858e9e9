"""One micro-batch's forward: the sampler-processed logprob of each of its loss tokens.

Token t is scored by the hidden state before it on its path (rows.py position convention): t-1 in
a padded row, its parent node in a packed/tree layout, under the temperature/top-p its call was
sampled with. The forward is the model's own; what changes with the device:

- attention of packed/tree micro-batches: the backend of trainer/attention_backend.py (CPU:
  segments; CUDA: FlexAttention), planned here per micro-batch;
- the LM head: trainer/chunked_logprobs.py applies it in chunks of scored tokens and returns the
  logprobs, so no [tokens, vocab] logits are kept for backward (a model whose logits are not a plain
  linear head gets full logits and trainer/logprobs.py, as before);
- CUDA: bf16 autocast for the forward, float32 master weights.

`trusted=True` computes a pass with the reference computations instead: no autocast (float32),
SDPA's MATH kernel, full logits and trainer/logprobs.py. The gradient guard measures its probe so
(trainer/grad_guard.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from grove.learner_config import LearnerConfig
from trainer.attention_backend import AttentionBackend, attention_kwargs, choose_backend, learner_sdpa
from trainer.batch import MicroBatch
from trainer.chunked_logprobs import ScoredTokens, logprob_head
from trainer.logprobs import processed_logprobs


def autocast(device: torch.device, *, enabled: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the learner's only CUDA mode); nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=enabled)
    return contextlib.nullcontext()


def pass_kernels(device: torch.device, *, trusted: bool = False) -> contextlib.AbstractContextManager:
    """SDPA kernels of a whole pass, forward and backward (trainer/attention_backend.py; trusted: MATH)."""
    return sdpa_kernel([SDPBackend.MATH]) if trusted else learner_sdpa(device)


def forward_kwargs(
    mb: MicroBatch, device: torch.device, backend: AttentionBackend | str | None = None
) -> dict:
    """Keywords of the model forward besides input_ids: positions, attention plan, head positions."""
    if mb.attention is None:
        return {}
    # packed and tree layouts set positions and logit positions with their attention plan
    assert mb.position_ids is not None and mb.logit_positions is not None
    plan = attention_kwargs(mb.attention, choose_backend(device, backend), device)
    return {
        "position_ids": mb.position_ids.to(device),
        **plan,
        "logits_to_keep": mb.logit_positions.to(device),
    }


def score_tokens(
    model: nn.Module,
    mb: MicroBatch,
    config: LearnerConfig,
    device: torch.device,
    *,
    backend: AttentionBackend | str | None = None,
    kwargs: dict | None = None,
    trusted: bool = False,
    full_logits: bool = False,
) -> Tensor:
    """Sampler-processed logprobs of the micro-batch's loss tokens, each under its span's sampling: [N].

    `kwargs`: `forward_kwargs(mb, ...)` when the caller already planned them (policy and reference
    share one plan). `full_logits`: the LM head over whole logits, as before chunking (the benchmark
    compares memory; `trusted` implies it). float32 (float64 for a float64 model).
    """
    ids = mb.input_ids.to(device)  # [B, T]
    extra = forward_kwargs(mb, device, backend) if kwargs is None else kwargs
    rows, pred = mb.loss_rows.to(device), mb.pred_positions.to(device)  # [N], [N]
    scored = ScoredTokens(
        rows=rows,
        positions=pred,
        tokens=ids[rows, mb.loss_positions.to(device)],
        temperature=mb.temperature.to(device),
        top_p=mb.top_p.to(device),
    )
    head = contextlib.nullcontext(False) if trusted or full_logits else logprob_head(model, scored)
    with autocast(device, enabled=not trusted), head as chunked:
        out = model(input_ids=ids, use_cache=False, **extra).logits
    if chunked:
        return out  # [N] logprobs from the chunked head
    return processed_logprobs(
        out[rows, pred], scored.tokens, temperature=scored.temperature, top_p=scored.top_p
    )
