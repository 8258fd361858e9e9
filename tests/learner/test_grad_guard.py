"""The gradient guard (trainer/grad_guard.py): a poisoned micro-batch is refused before the optimizer step,
with weights, optimizer state, counters and guard history untouched; clean steps are not refused.

Poison = what a broken attention kernel does: the tree layout's bucket attention passes its output
unchanged but multiplies the gradient flowing back through it (x1e6: finite garbage, the issue's
cuDNN case) or turns it into NaN. The guard's probe runs the padded layout, which never calls the
bucket attention, so the reference it measures is a clean one, as on a GPU where the probe runs the
reference kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.forests import random_batch
from grove.learner_config import LearnerConfig
from tests.learner.test_reference import controlled_batch, rows_of
from trainer import attention
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.grad_guard import (
    IMPLAUSIBLE_FACTOR,
    GradientGuard,
    ImplausibleGradientError,
    NonFiniteError,
    PassCheck,
)
from trainer.learner import Learner, prepare_batch

CPU = torch.device("cpu")


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def poison_bucket_attention(monkeypatch, factor: float, *, from_call: int = 0) -> list[int]:
    """Bucket attention whose backward multiplies by `factor` from its `from_call`-th forward on."""
    real = attention._bucket_attention
    calls = []

    def poisoned(b, q, k, v, scaling):
        calls.append(1)
        out = real(b, q, k, v, scaling)
        return _ScaleGrad.apply(out, factor) if len(calls) > from_call else out

    monkeypatch.setattr(attention, "_bucket_attention", poisoned)
    return calls


def snapshot(learner: Learner) -> dict:
    params = {k: v.detach().clone() for k, v in learner.model.named_parameters()}
    state = {
        (i, k): v.clone() if torch.is_tensor(v) else v
        for i, s in enumerate(learner.optimizer.state.values())
        for k, v in s.items()
    }
    return {
        "params": params, "optimizer": state, "history": list(learner.guard.history),
        "counters": (learner.step_count, learner.rollouts_consumed),
        "lr": [g["lr"] for g in learner.optimizer.param_groups],
    }  # fmt: skip


def assert_untouched(learner: Learner, before: dict) -> None:
    after = snapshot(learner)
    assert after["counters"] == before["counters"] and after["history"] == before["history"]
    assert after["lr"] == before["lr"]
    assert all(torch.equal(after["params"][k], v) for k, v in before["params"].items())
    assert after["optimizer"].keys() == before["optimizer"].keys()
    for key, v in before["optimizer"].items():
        assert torch.equal(after["optimizer"][key], v) if torch.is_tensor(v) else after["optimizer"][key] == v
    assert all(p.grad is None for p in learner.model.parameters())


def tree_learner(model_dir, **knobs) -> Learner:
    return Learner(model_dir, LearnerConfig(layout="tree", lr=1e-3, **knobs), device="cpu")


def test_a_fresh_learner_refuses_finite_garbage_in_its_first_micro_batch(small_model_dir, monkeypatch):
    """The issue's case: one micro-batch, no history; the probe's reference catches it."""
    rows = rows_of(controlled_batch(512))
    learner = tree_learner(small_model_dir)
    before = snapshot(learner)
    poison_bucket_attention(monkeypatch, 1e6)
    with pytest.raises(ImplausibleGradientError, match=r"micro-batch 1 of 1 .* the reference"):
        learner.step(rows)
    assert_untouched(learner, before)
    monkeypatch.undo()
    metrics = learner.step(rows)  # the same batch, healthy kernel: taken
    assert metrics.step == 1 and len(learner.guard.history) == 2  # probe + the pass


def test_a_poisoned_micro_batch_among_clean_ones_is_refused_untouched(small_model_dir, monkeypatch):
    learner = tree_learner(small_model_dir, micro_batch_tokens=120)
    learner.step(rows_of(random_batch(4, vocab=512, size=4)))  # a clean step first: AdamW state, history
    rows = rows_of(random_batch(5, vocab=512, size=4))
    passes = len(prepare_batch(rows, learner.config).plan)
    assert passes >= 3
    first = _bucket_calls_of_first_micro_batch(learner, rows, monkeypatch)
    before = snapshot(learner)
    poison_bucket_attention(monkeypatch, 1e6, from_call=first)  # the second micro-batch on
    with pytest.raises(ImplausibleGradientError, match=f"micro-batch 2 of {passes}"):
        learner.step(rows)
    assert_untouched(learner, before)


def _bucket_calls_of_first_micro_batch(learner: Learner, rows, monkeypatch) -> int:
    """How many bucket-attention calls the first micro-batch's forward makes (no step taken)."""
    from trainer.scoring import score_tokens

    calls = poison_bucket_attention(monkeypatch, 1.0)
    mb = prepare_batch(rows, learner.config).plan[0]
    with torch.no_grad():
        score_tokens(learner.model, mb, learner.config, CPU)
    monkeypatch.undo()
    return len(calls)


def test_nan_in_one_micro_batch_is_refused_naming_it(small_model_dir, monkeypatch):
    rows = rows_of(random_batch(6, vocab=512, size=4))
    learner = tree_learner(small_model_dir, micro_batch_tokens=120)
    learner.guard = GradientGuard([1.0])  # a history: no probe, the passes are the only backwards
    mlp = learner.model.model.layers[0].mlp
    backwards = []

    def nan_on_second(module, grad_input, grad_output):
        backwards.append(1)
        return tuple(g * float("nan") for g in grad_input) if len(backwards) == 2 else None

    mlp.register_full_backward_hook(nan_on_second)
    passes = len(prepare_batch(rows, learner.config).plan)
    before = snapshot(learner)
    with pytest.raises(NonFiniteError, match=rf"micro-batch 2 of {passes} .*model\.layers\.0"):
        learner.step(rows)
    assert_untouched(learner, before)


@pytest.mark.parametrize("layout", ["padded", "packed", "tree"])
def test_clean_steps_are_never_refused(small_model_dir, layout):
    """Steps of different batches and micro-batch sizes (1 row per micro-batch .. all in one), lr high
    enough that the weights move: every pass stays far inside the limit."""
    learner = Learner(small_model_dir, LearnerConfig(layout=layout, lr=3e-3), device="cpu")
    for step, budget in enumerate([1, 100_000, 150, 1, 60, 100_000]):
        learner.budget = budget
        learner.step(rows_of(random_batch(20 + step, vocab=512, size=4)))
    scales = list(learner.guard.history)
    assert len(scales) > 12 and max(scales) / min(scales) < IMPLAUSIBLE_FACTOR / 10


def test_loss_weight_is_the_sum_of_the_loss_gradient_over_logprobs(small_model_dir):
    """w = sum_i |d loss / d logp_i|, recomputed here from the PPO-clip formula: |r A| / D for the
    tokens whose clipped branch is not active, 0 for the others."""
    rows = rows_of(random_batch(7, vocab=512, size=4))
    learner = Learner(small_model_dir, LearnerConfig(layout="packed", clip_low=0.05, clip_high=0.05))
    checks: list[PassCheck] = []

    class Recording(GradientGuard):
        def check(self, p, step, bad):
            checks.append(p)
            super().check(p, step, bad)

    learner.guard = Recording([1.0])
    batch = prepare_batch(rows, learner.config)
    from trainer.scoring import score_tokens

    want = []
    with torch.no_grad():
        for mb in batch.plan:
            logp = score_tokens(learner.model, mb, learner.config, CPU).double()
            r = torch.exp(logp - mb.behavior_logprobs.double())
            a = mb.advantages.double()
            active = torch.where(a > 0, r < 1.05, r > 0.95) | (a == 0)
            want.append(float((r * a).abs()[active].sum()) / batch.denominator)
    learner.step(rows)
    assert [c.loss_weight for c in checks] == pytest.approx(want, rel=1e-5)
    assert any(w > 0 for w in want)


def test_guard_arithmetic():
    guard = GradientGuard([2.0, 4.0, 100.0])
    assert guard.reference() == 4.0  # the median: one odd value does not move it
    at_limit = PassCheck(0, 2, ("r",), 10, 0.5, loss_weight=0.5, grad_norm=4.0 * IMPLAUSIBLE_FACTOR * 0.5)
    guard.begin_step()
    with pytest.raises(ImplausibleGradientError, match="micro-batch 2 of 2"):
        guard.check(dataclasses.replace(at_limit, index=1, grad_norm=at_limit.grad_norm * 1.01), 1, [])
    with pytest.raises(NonFiniteError, match="gradient norm nan"):
        guard.check(dataclasses.replace(at_limit, grad_norm=float("nan")), 1, [])
    with pytest.raises(NonFiniteError):
        guard.check(dataclasses.replace(at_limit, loss=float("inf")), 1, [])
    guard.check(dataclasses.replace(at_limit, loss_weight=0.0, grad_norm=1e30), 1, [])  # no weight: no scale
    guard.check(at_limit, 1, [])  # exactly at the limit: accepted
    assert list(guard.history) == [2.0, 4.0, 100.0]  # nothing joins before the step is taken
    assert guard.reference() == (4.0 + 100.0) / 2  # but this step's passes count for its next ones
    guard.commit()
    assert list(guard.history) == [2.0, 4.0, 100.0, 4.0 * IMPLAUSIBLE_FACTOR]


def test_the_history_is_checkpointed(small_model_dir, store, tmp_path):
    learner = Learner(small_model_dir, LearnerConfig(layout="packed", lr=1e-3), device="cpu")
    learner.step(rows_of(random_batch(8, vocab=512, size=3)))
    assert learner.guard.history
    save_checkpoint(store, "run-guard", learner)
    resumed = load_checkpoint(store, "run-guard", 1, learner.config, tmp_path / "m", device="cpu")
    assert list(resumed.guard.history) == list(learner.guard.history)
    assert not resumed.guard.needs_probe()
