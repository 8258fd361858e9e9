"""A real optimizer step on a batch with worker actions moves the worker's tokens the right way.

Episode A (reward 1) and episode B (reward 0) form one group; each has a parent that spawns a
worker whose answer returns to the parent. Behaviour logprobs are the model's own (on-policy),
computed here by a plain forward pass, so every ratio starts at 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.forests import Call, Episode, rows_from_calls
from grove.learner_config import LearnerConfig
from trainer.batch import plan_micro_batches
from trainer.learner import Learner, accumulate_gradients, prepare_batch

CPU = torch.device("cpu")


def on_policy_logprobs(model, prompt: np.ndarray, completion: np.ndarray) -> np.ndarray:
    seq = torch.from_numpy(np.concatenate([prompt, completion]).astype(np.int64))[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0].float(), -1)
    pos = torch.arange(prompt.size - 1, prompt.size - 1 + completion.size)
    return logp[pos, torch.from_numpy(completion.astype(np.int64))].numpy().astype(np.float32)


def episode(model, episode_id: str, reward: float, seed: int) -> Episode:
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size

    def toks(n):
        return rng.integers(3, vocab, size=n).astype(np.int32)

    def call(cid, agent, ctx, parent, prompt, n):
        completion = toks(n)
        lp = on_policy_logprobs(model, prompt, completion)
        return Call(cid, agent, ctx, parent.call_id if parent else None, prompt, completion, lp)

    p0 = call("parent/c0/000", "parent", "parent/c0", None, toks(8), 6)
    w0 = call("worker-1/c0/000", "worker-1", "worker-1/c0", None, toks(7), 8)
    w1 = call(
        "worker-1/c0/001",
        "worker-1",
        "worker-1/c0",
        w0,
        np.concatenate([w0.prompt, w0.completion, toks(3)]),
        8,
    )
    p1_prompt = np.concatenate([p0.prompt, p0.completion, toks(1), w1.completion])
    p1 = call("parent/c0/001", "parent", "parent/c0", p0, p1_prompt, 5)
    return Episode(episode_id, "g", reward, [p0, w0, w1, p1])


def worker_tokens_logprob(model, ep: Episode) -> float:
    return float(
        sum(on_policy_logprobs(model, c.prompt, c.completion).sum() for c in ep.calls if c.agent != "parent")
    )


@pytest.fixture
def learner(learner_model_dir):
    return Learner(learner_model_dir, LearnerConfig(lr=1e-3, rollouts_per_step=2), device="cpu")


def test_positive_advantage_worker_tokens_gain_logprob(learner):
    a = episode(learner.model, "A", 1.0, seed=1)
    b = episode(learner.model, "B", 0.0, seed=2)
    rows = rows_from_calls(a) + rows_from_calls(b)
    before_a, before_b = worker_tokens_logprob(learner.model, a), worker_tokens_logprob(learner.model, b)
    metrics = learner.step(rows)
    assert metrics.ratio_mean == pytest.approx(
        1.0, abs=1e-5
    )  # on-policy: the learner agrees with the forward
    assert metrics.step == 1 and metrics.rollouts == 2 and metrics.loss_tokens == 2 * (6 + 8 + 8 + 5)
    after_a, after_b = worker_tokens_logprob(learner.model, a), worker_tokens_logprob(learner.model, b)
    assert after_a > before_a + 1e-3  # A's worker (advantage +0.707) is reinforced
    assert after_b < before_b - 1e-3  # B's worker (advantage -0.707) is discouraged


def _worker_row_grad_norm(learner, rows) -> float:
    cfg = learner.config
    batch = prepare_batch(rows, cfg)
    worker_rows = [r for r in rows if "#worker-" in r.row_id]
    plan = plan_micro_batches(worker_rows, {e: x.advantage for e, x in batch.advantages.items()}, 10**6)
    learner.model.zero_grad(set_to_none=True)
    accumulate_gradients(learner.model, plan, batch.denominator, cfg, CPU)
    grads = [p.grad for p in learner.model.parameters() if p.grad is not None]
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))) if grads else 0.0


def test_worker_owned_rows_give_gradient_unless_parent_only(learner):
    a = episode(learner.model, "A", 1.0, seed=3)
    b = episode(learner.model, "B", 0.0, seed=4)
    full = rows_from_calls(a) + rows_from_calls(b)
    parent_only = rows_from_calls(a, parent_only=True) + rows_from_calls(b, parent_only=True)
    assert sum("#worker-" in r.row_id for r in full) == 2  # one worker-owned row per episode
    assert _worker_row_grad_norm(learner, full) > 1e-3
    # parent-only: no worker action carries loss (the reconstruction drops loss-free worker rows)
    assert not any(s.eligible for r in parent_only for s in r.spans if s.agent != "parent")
    assert not any(r.num_loss_tokens for r in parent_only if "#worker-" in r.row_id)
    assert _worker_row_grad_norm(learner, parent_only) == 0.0
    assert prepare_batch(parent_only, learner.config).denominator == 2 * (6 + 5)
