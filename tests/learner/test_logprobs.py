"""Sampler-processed logprobs (temperature, vLLM's top-p rule) on hand-computed distributions."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.logprobs import processed_logprobs

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0]])


def lp(token: int, temperature: float = 1.0, top_p: float = 1.0) -> float:
    return processed_logprobs(LOGITS, torch.tensor([token]), temperature=temperature, top_p=top_p).item()


def test_plain_log_softmax():
    z = sum(math.exp(x) for x in (2, 1, 0, -1))
    assert lp(0) == pytest.approx(2 - math.log(z), abs=1e-6)
    assert lp(3) == pytest.approx(-1 - math.log(z), abs=1e-6)


def test_temperature_divides_the_logits():
    z = sum(math.exp(x) for x in (4, 2, 0, -2))  # T = 0.5
    assert lp(1, temperature=0.5) == pytest.approx(2 - math.log(z), abs=1e-6)


def test_top_p_keeps_the_smallest_head_reaching_p():
    # probs 0.644, 0.237, 0.087, 0.032: ascending cumulative 0.032, 0.119, 0.356, 1.0;
    # top_p 0.7 masks cumulative <= 0.3, i.e. the two least likely tokens.
    assert lp(0, top_p=0.7) == pytest.approx(2 - math.log(math.exp(2) + math.exp(1)), abs=1e-6)
    assert lp(1, top_p=0.7) == pytest.approx(1 - math.log(math.exp(2) + math.exp(1)), abs=1e-6)
    assert lp(2, top_p=0.7) == -math.inf


def test_top_p_always_keeps_the_most_likely_token():
    assert lp(0, top_p=0.01) == pytest.approx(0.0, abs=1e-7)
    assert lp(1, top_p=0.01) == -math.inf


def test_gradient_flows_only_through_kept_logits():
    logits = LOGITS.clone().requires_grad_(True)
    processed_logprobs(logits, torch.tensor([0]), temperature=1.0, top_p=0.7).sum().backward()
    p0 = math.exp(2) / (math.exp(2) + math.exp(1))
    assert logits.grad[0].tolist() == pytest.approx([1 - p0, -(1 - p0), 0.0, 0.0], abs=1e-6)


def test_bf16_logits_are_scored_in_float32():
    out = processed_logprobs(LOGITS.bfloat16(), torch.tensor([0]), temperature=1.0, top_p=1.0)
    assert out.dtype == torch.float32
