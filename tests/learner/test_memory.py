"""Activation checkpointing and the token budget from a memory limit (trainer/memory.py)."""

from __future__ import annotations

import pytest
import torch

from grove.learner_config import LearnerConfig
from tests.learner.test_reference import controlled_batch, rows_of
from trainer.learner import Learner, accumulate_gradients, prepare_batch
from trainer.memory import MemoryBudgetError, activation_bytes_per_token, token_budget

CPU = torch.device("cpu")


def grads_and_layer_calls(learner: Learner, rows) -> tuple[dict, int]:
    """Gradients of the batch loss, and how often decoder layer 0's forward ran."""
    calls = []
    layer = learner.model.model.layers[0]
    handle = layer.register_forward_pre_hook(lambda *_: calls.append(1))  # recompute may stop early
    batch = prepare_batch(rows, learner.config)
    learner.model.zero_grad(set_to_none=True)
    accumulate_gradients(learner.model, batch.plan, batch.denominator, learner.config, CPU)
    handle.remove()
    return {k: p.grad.clone() for k, p in learner.model.named_parameters()}, len(calls) // len(batch.plan)


@pytest.mark.parametrize("layout", ["padded", "tree"])
def test_checkpointing_recomputes_layers_and_keeps_gradients_exact(small_model_dir, layout):
    rows = rows_of(controlled_batch(512))
    plain, runs_plain = grads_and_layer_calls(Learner(small_model_dir, LearnerConfig(layout=layout)), rows)
    cfg = LearnerConfig(layout=layout, activation_checkpointing=True)
    ckpt_learner = Learner(small_model_dir, cfg)
    ckpt, runs_ckpt = grads_and_layer_calls(ckpt_learner, rows)
    assert (runs_plain, runs_ckpt) == (1, 2)  # forward, then the recompute in backward
    assert not any(
        m.training
        for m in ckpt_learner.model.model.layers[0].modules()
        if m is not ckpt_learner.model.model.layers[0]
    )
    for name, g in plain.items():
        assert torch.equal(ckpt[name], g), name


def test_memory_limit_sets_the_micro_batch_budget(small_model_dir):
    rows = rows_of(controlled_batch(512))
    free = Learner(small_model_dir, LearnerConfig(layout="packed"))
    config = free.model.config
    per_token = activation_bytes_per_token(config, checkpointing=False)
    # a limit of ~100 tokens' activations: the step plans micro-batches of <= 100 forwarded tokens
    limit_mb = max(1, 100 * per_token // 2**20)
    want = limit_mb * 2**20 // per_token
    tight = Learner(small_model_dir, LearnerConfig(layout="packed", memory_limit_mb=limit_mb))
    assert tight.budget == want == token_budget(config, limit_mb, checkpointing=False)
    m = tight.step(rows)
    assert m.micro_batches > free.step(rows).micro_batches == 1
    assert activation_bytes_per_token(config, checkpointing=True) < per_token


def test_a_limit_below_one_token_is_refused(small_model_dir):
    class Huge:
        hidden_size, intermediate_size, num_attention_heads, num_hidden_layers = 8192, 28672, 64, 80
        vocab_size, num_key_value_heads, head_dim = 128256, 8, 128

    with pytest.raises(MemoryBudgetError, match="memory_limit_mb=1 holds no token"):
        token_budget(Huge(), 1, checkpointing=False)
