"""The gradient guard (trainer/grad_guard.py): a poisoned micro-batch is refused before the optimizer step,
with weights, optimizer state, counters and guard history untouched; clean steps are not refused, on
random rows and on rows sampled on-policy from the model at temperatures 0.01 .. 2.

Poison = what a broken attention kernel does: the tree layout's bucket attention passes its output
unchanged but multiplies the gradient flowing back through it (x1e6: finite garbage, the issue's
cuDNN case) or turns it into NaN. The guard's probe runs the padded layout, which never calls the
bucket attention, so the reference it measures is a clean one, as on a GPU where the probe runs the
reference kernels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bench.forests import Call, Episode, random_batch, with_mixed_sampling
from grove.learner_config import LearnerConfig
from tests.learner.test_reference import MIXED, controlled_batch, rows_of
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
from trainer.logprobs import processed_logprobs

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
    with pytest.raises(ImplausibleGradientError, match=r"micro-batch 1 of 1 .* the anchor") as refused:
        learner.step(rows)
    assert refused.value.evidence["pass"] == 1 and refused.value.evidence["ratio"] > IMPLAUSIBLE_FACTOR
    assert_untouched(learner, before)
    assert learner.guard.anchor is None  # a refused step keeps nothing, not even its probe
    monkeypatch.undo()
    metrics = learner.step(rows)  # the same batch, healthy kernel: taken
    assert metrics.step == 1 and len(learner.guard.history) == 1 and learner.guard.anchor > 0


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
    learner.guard = GradientGuard(anchor=1.0)  # an anchor: no probe, the passes are the only backwards
    mlp = learner.model.model.layers[0].mlp
    backwards = []

    def nan_on_second(module, grad_input, grad_output):
        backwards.append(1)
        return tuple(g * float("nan") for g in grad_input) if len(backwards) == 2 else None

    mlp.register_full_backward_hook(nan_on_second)
    passes = len(prepare_batch(rows, learner.config).plan)
    before = snapshot(learner)
    with pytest.raises(NonFiniteError, match=rf"micro-batch 2 of {passes} .*model\.layers\.0") as refused:
        learner.step(rows)
    assert refused.value.evidence["pass"] == 2 and refused.value.evidence["grad_norm"] == "nan"
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
    assert len(scales) > 12 and max(scales) / learner.guard.anchor < IMPLAUSIBLE_FACTOR / 10


def test_loss_weight_is_the_sum_of_the_loss_gradient_over_logprobs(small_model_dir):
    """w = sum_i |d loss / d logp_i| / T_i, recomputed here from the PPO-clip formula: |r A| / (D T) for
    the tokens whose clipped branch is not active, 0 for the others (calls at several temperatures)."""
    rows = rows_of(with_mixed_sampling(random_batch(7, vocab=512, size=4), MIXED, 7))
    learner = Learner(small_model_dir, LearnerConfig(layout="packed", clip_low=0.05, clip_high=0.05))
    checks: list[PassCheck] = []

    class Recording(GradientGuard):
        def check(self, p, step, bad):
            checks.append(p)
            super().check(p, step, bad)

    learner.guard = Recording(anchor=1.0)
    batch = prepare_batch(rows, learner.config)
    from trainer.scoring import score_tokens

    want = []
    with torch.no_grad():
        for mb in batch.plan:
            logp = score_tokens(learner.model, mb, learner.config, CPU).double()
            r = torch.exp(logp - mb.behavior_logprobs.double())
            a = mb.advantages.double()
            active = torch.where(a > 0, r < 1.05, r > 0.95) | (a == 0)
            per_token = (r * a).abs() / mb.temperature.double()
            want.append(float(per_token[active].sum()) / batch.denominator)
    learner.step(rows)
    assert [c.loss_weight for c in checks] == pytest.approx(want, rel=1e-5)
    assert any(w > 0 for w in want)


def test_guard_arithmetic():
    guard = GradientGuard(anchor=4.0, history=[2.0, 3.0])
    at_limit = PassCheck(0, 2, ("r",), 10, 0.5, loss_weight=0.5, grad_norm=4.0 * IMPLAUSIBLE_FACTOR * 0.5)
    guard.begin_step()
    with pytest.raises(ImplausibleGradientError, match="micro-batch 2 of 2") as refused:
        guard.check(dataclasses.replace(at_limit, index=1, grad_norm=at_limit.grad_norm * 1.01), 1, [])
    evidence = refused.value.evidence
    assert (evidence["pass"], evidence["rows"], evidence["anchor"]) == (2, ["r"], 4.0)
    assert evidence["ratio"] == pytest.approx(IMPLAUSIBLE_FACTOR * 1.01)
    with pytest.raises(NonFiniteError, match="gradient norm nan"):
        guard.check(dataclasses.replace(at_limit, grad_norm=float("nan")), 1, [])
    with pytest.raises(NonFiniteError):
        guard.check(dataclasses.replace(at_limit, loss=float("inf")), 1, [])
    guard.check(dataclasses.replace(at_limit, loss_weight=0.0, grad_norm=1e30), 1, [])  # no weight: no scale
    guard.check(at_limit, 1, [])  # exactly at the limit: accepted
    assert list(guard.history) == [2.0, 3.0]  # nothing joins before the step is taken
    guard.commit()
    assert list(guard.history) == [2.0, 3.0, 4.0 * IMPLAUSIBLE_FACTOR] and guard.anchor == 4.0


def test_zero_gradients_have_no_scale_and_never_poison_the_reference():
    """Confident tokens at a low temperature give a pass loss weight and an exactly zero gradient:
    it has no scale, however many there are, and the next pass with a gradient is compared with the
    anchor (no division by zero anywhere)."""
    guard = GradientGuard()
    guard.begin_step()
    guard.calibrate(0.0)  # a probe that measured nothing is no anchor
    assert guard.needs_probe()
    guard.calibrate(2.0)
    for k in range(40):
        guard.check(PassCheck(k, 41, ("r",), 3, 0.1, loss_weight=0.5, grad_norm=0.0), 1, [])
    guard.check(PassCheck(40, 41, ("r",), 3, 0.1, loss_weight=0.5, grad_norm=1.0), 1, [])
    guard.commit()
    assert list(guard.history) == [2.0] and guard.anchor == 2.0


def test_a_gradient_growing_a_little_every_step_is_refused():
    """1.25x per step (a slowly failing kernel): the anchor does not follow, so the pass that reaches
    1000x the run's start is refused (1.25^31 = 1009)."""
    guard = GradientGuard(anchor=1.0)
    refused_at = None
    for step in range(1, 81):
        guard.begin_step()
        try:
            guard.check(PassCheck(0, 1, ("r",), 8, 0.1, loss_weight=1.0, grad_norm=1.25**step), step, [])
        except ImplausibleGradientError:
            refused_at = step
            break
        guard.commit()
    assert refused_at == 31


# ---- on-policy rows at low and high temperatures ----------------------------------------------------


def sample_call(model, prompt: np.ndarray, n: int, temperature: float, top_p: float, gen: torch.Generator):
    """n tokens sampled from the model's processed distribution (trainer/logprobs.py, vLLM's recipe), and
    their processed logprobs: what the engine records as behaviour logprobs."""
    ids = torch.from_numpy(prompt.astype(np.int64))
    logprobs = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids[None]).logits[0, -1:].float()
            scaled = processed_logprobs(
                logits.expand(logits.shape[-1], -1), torch.arange(logits.shape[-1]),
                temperature=temperature, top_p=top_p,
            )  # fmt: skip
            token = torch.multinomial(scaled.exp(), 1, generator=gen)
            logprobs.append(float(scaled[token]))
            ids = torch.cat([ids, token])
    return ids[len(prompt) :].numpy().astype(np.int32), np.array(logprobs, dtype=np.float32)


def on_policy_batch(model, temperature: float, top_p: float, seed: int, vocab: int) -> list[Episode]:
    """2 groups x 3 episodes, each a root call and one extension, sampled at (temperature, top_p)."""
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    episodes = []
    for e in range(6):
        prompt = rng.integers(3, vocab, size=6).astype(np.int32)
        done, lp = sample_call(model, prompt, 5, temperature, top_p, gen)
        c0 = Call("a/c0/000", "a", "a/c0", None, prompt, done, lp, temperature=temperature, top_p=top_p)
        prompt2 = np.concatenate([prompt, done, rng.integers(3, vocab, size=2).astype(np.int32)])
        done2, lp2 = sample_call(model, prompt2, 4, temperature, top_p, gen)
        c1 = Call(
            "a/c0/001", "a", "a/c0", c0.call_id, prompt2, done2, lp2, temperature=temperature, top_p=top_p
        )
        episodes.append(Episode(f"t{temperature}-{e}", f"g{e % 2}", float(rng.integers(0, 3)), [c0, c1]))
    return episodes


@pytest.mark.parametrize("layout", ["padded", "tree"])
def test_on_policy_steps_at_low_and_high_temperatures_are_never_refused(small_model_dir, layout):
    """Rows sampled from the policy itself at T = 0.01 (softmax saturated: many exactly-zero
    gradients), 0.03, 0.3, 1 and 2 (top_p 1 and 0.9), one temperature per step, lr high enough that the
    weights move: every step is taken, every pass far inside the limit."""
    config = LearnerConfig(layout=layout, lr=3e-3, micro_batch_tokens=40)
    learner = Learner(small_model_dir, config, device="cpu")
    settings = [(0.01, 1.0), (0.03, 1.0), (1.0, 1.0), (0.01, 0.9), (2.0, 0.9), (0.3, 1.0), (0.03, 0.9)]
    ratios = []
    for step, (t, p) in enumerate(settings):
        episodes = on_policy_batch(learner.model, t, p, seed=step, vocab=512)
        metrics = learner.step(rows_of(episodes))
        assert metrics.guard_refused == 0 and not metrics.skipped
        ratios.append(metrics.guard_ratio)
    assert max(ratios) < IMPLAUSIBLE_FACTOR / 10, ratios
    assert min(ratios) < max(ratios) / 10  # the saturated low-temperature steps do sit far lower


# ---- the operator's setting ---------------------------------------------------------------------------


def test_skip_drops_the_refused_step_and_the_run_goes_on(small_model_dir, monkeypatch):
    rows = rows_of(controlled_batch(512))
    learner = tree_learner(small_model_dir, guard_refusal="skip")
    learner.step(rows)  # a clean step: an anchor, AdamW state
    before = snapshot(learner)
    poison_bucket_attention(monkeypatch, 1e6)
    metrics = learner.step(rows)
    assert metrics.skipped and metrics.guard_refused == 1 and metrics.step == 2
    assert learner.last_refusal["kind"] == "implausible" and learner.last_refusal["rows"]
    after = snapshot(learner)
    assert all(torch.equal(after["params"][k], v) for k, v in before["params"].items())
    assert after["history"] == before["history"]
    monkeypatch.undo()
    assert learner.step(rows).guard_refused == 0  # the next step trains


def test_accept_trains_an_implausible_pass_but_never_a_non_finite_one(small_model_dir, monkeypatch):
    rows = rows_of(controlled_batch(512))
    learner = tree_learner(small_model_dir, guard_refusal="accept")
    learner.step(rows)
    before = snapshot(learner)
    poison_bucket_attention(monkeypatch, 1e3 * IMPLAUSIBLE_FACTOR)
    metrics = learner.step(rows)
    assert metrics.guard_refused == 1 and not metrics.skipped and metrics.guard_ratio == 0.0
    assert learner.last_refusal["ratio"] > IMPLAUSIBLE_FACTOR
    after = snapshot(learner)
    assert not all(torch.equal(after["params"][k], v) for k, v in before["params"].items())
    monkeypatch.undo()
    poison_bucket_attention(monkeypatch, float("nan"))
    before = snapshot(learner)
    metrics = learner.step(rows)
    assert metrics.skipped and metrics.guard_refused == 1 and learner.last_refusal["kind"] == "non-finite"
    assert all(torch.equal(snapshot(learner)["params"][k], v) for k, v in before["params"].items())


def test_the_guard_setting_is_not_fingerprinted():
    """An operator changes it on a run's checkpoint; configs written before it keep their fingerprint."""
    assert LearnerConfig(guard_refusal="skip").fingerprint() == LearnerConfig().fingerprint()


def test_the_anchor_is_checkpointed(small_model_dir, store, tmp_path):
    learner = Learner(small_model_dir, LearnerConfig(layout="packed", lr=1e-3), device="cpu")
    learner.step(rows_of(random_batch(8, vocab=512, size=3)))
    assert learner.guard.history and learner.guard.anchor > 0
    save_checkpoint(store, "run-guard", learner)
    resumed = load_checkpoint(store, "run-guard", 1, learner.config, tmp_path / "m", device="cpu")
    assert list(resumed.guard.history) == list(learner.guard.history)
    assert resumed.guard.anchor == learner.guard.anchor and not resumed.guard.needs_probe()
