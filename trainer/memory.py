"""Activation memory: activation checkpointing and a micro-batch token budget from a memory limit.

A packed micro-batch's activation memory grows linearly in its forwarded tokens (attention never
materialises [N, N] scores: SDPA's fused kernels, segment buckets of trainer/attention.py), so a
memory limit gives a token budget: limit / bytes per token. Bytes per token are estimated from the
model's shape, counting what autograd keeps for backward in a Qwen/Llama-style decoder layer (norm
inputs, q/k/v and their rotated copies, attention output, MLP gate/up/activation). A scored token
adds no [vocab] logits: trainer/chunked_logprobs.py keeps its hidden state and a few numbers, and its
chunk buffer is a fixed size, not per token (`full_logits=True` counts the float32 logits and
log-softmax a model without a plain LM head still keeps). With activation checkpointing only each
layer's input is kept, plus one layer's activations while it is recomputed. The estimate is an
upper-bound style model, not a measurement; bench/bench_learner.py --memory shows measured peaks.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer


class MemoryBudgetError(ValueError):
    """The memory limit cannot hold even one token's activations."""


def activation_bytes_per_token(
    model_config, *, checkpointing: bool, dtype_bytes: int = 4, full_logits: bool = False
) -> int:
    """Estimated bytes of activations autograd keeps per forwarded token."""
    h = model_config.hidden_size
    inter = model_config.intermediate_size
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or h // heads
    kv = getattr(model_config, "num_key_value_heads", heads) * head_dim
    q = heads * head_dim
    per_layer = (6 * h + 3 * q + 4 * kv + 4 * inter) * dtype_bytes
    layers = model_config.num_hidden_layers
    kept = layers * h * dtype_bytes + per_layer if checkpointing else layers * per_layer
    # per scored token: float32 logits + log-softmax, or (chunked head) its hidden state, temperature,
    # top-p cut and int64 token id
    scored = 2 * model_config.vocab_size * 4 if full_logits else (h + 4) * 4
    return kept + scored


def token_budget(
    model_config, memory_limit_mb: int, *, checkpointing: bool, full_logits: bool = False
) -> int:
    """Forwarded tokens of one micro-batch that fit `memory_limit_mb` of activations."""
    per_token = activation_bytes_per_token(model_config, checkpointing=checkpointing, full_logits=full_logits)
    tokens = memory_limit_mb * 2**20 // per_token
    if tokens < 1:
        raise MemoryBudgetError(
            f"memory_limit_mb={memory_limit_mb} holds no token: one token needs ~{per_token} bytes of "
            "activations for this model; raise the limit or enable activation_checkpointing"
        )
    return int(tokens)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations.

    transformers only checkpoints layers in training mode, and the learner runs in eval mode (no
    dropout: behaviour logprobs were sampled without it). So only the decoder layer modules
    themselves are flagged as training; their submodules (attention, dropout) stay in eval mode.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"activation checkpointing needs a transformers model, got {type(model).__name__}")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.eval()
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True
