"""The learner scores every token under its own span's sampling; configs it cannot mirror are refused.

- `processed_logprobs` with per-token temperature/top-p arrays equals an independent per-row
  computation written here (float64 logits: exact math; the top-p rule computed the other way round,
  descending sort with exclusive mass < top_p).
- The micro-batch carries each loss token's span temperature/top-p, aligned with its behaviour logprob.
- On-policy at identical weights the learner's ratio is 1 for every token: tokens are sampled here
  from the model's own processed distribution at mixed settings (T=0.5, T=1.3 with top-p 0.8, ...),
  their behaviour logprobs computed by the test's reference, and the learner's logprobs match them.
  LearnerConfig.temperature is not read by the scoring (a learner at T=1.3 still gives ratio 1).
- Refusals, each by name: a loss span without mirrorable sampling (SpanSamplingError), a RunConfig
  whose learner and sampling disagree (SamplingMismatchError, naming both values), a SamplingConfig
  naming a parameter the learner cannot mirror (UnmirrorableSamplingError).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bench.forests import Call, Episode, rows_from_calls
from grove.contracts import RunConfig, SamplingMismatchError
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig, UnmirrorableSamplingError
from trainer.batch import SpanSamplingError, validate_rows
from trainer.learner import load_policy, prepare_batch, score_tokens
from trainer.logprobs import processed_logprobs

CPU = torch.device("cpu")


def reference_logprob(logits: torch.Tensor, token: int, temperature: float, top_p: float) -> float:
    """One row, float64: log_softmax(top-p-masked logits / T) at `token` (written independently)."""
    scaled = logits.double() / temperature
    if top_p < 1.0:
        probs, order = scaled.softmax(-1).sort(descending=True)
        mass_before = probs.cumsum(-1) - probs
        drop = torch.zeros_like(scaled, dtype=torch.bool)
        drop[order[mass_before >= top_p]] = True
        scaled = scaled.masked_fill(drop, float("-inf"))
    return float(scaled.log_softmax(-1)[token])


def test_per_token_settings_equal_an_independent_per_row_computation():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 50, generator=gen, dtype=torch.float64)
    rank = torch.tensor([0, 1, 2, 0, 3, 1, 0, 2, 1, 0, 49, 2])  # mostly inside the top-p sets; one outside
    tokens = logits.argsort(-1, descending=True)[torch.arange(12), rank]
    temps = torch.tensor([0.5, 1.0, 1.3, 0.7] * 3, dtype=torch.float64)
    top_ps = torch.tensor([1.0, 0.9, 0.8, 1.0, 0.95, 1.0] * 2, dtype=torch.float64)
    got = processed_logprobs(logits, tokens, temperature=temps, top_p=top_ps)
    for i in range(12):
        want = reference_logprob(logits[i], int(tokens[i]), float(temps[i]), float(top_ps[i]))
        assert (got[i].item() == want == float("-inf")) or got[i].item() == pytest.approx(want, abs=1e-12), i
    cut = top_ps < 1
    assert int(torch.isfinite(got[cut]).sum()) >= 3 and bool(torch.isinf(got[10]))  # both top-p cases
    # one scalar for all rows is the same as the array filled with it
    same = processed_logprobs(
        logits,
        tokens,
        temperature=torch.full((12,), 0.7, dtype=torch.float64),
        top_p=torch.full((12,), 0.9, dtype=torch.float64),
    )
    assert torch.equal(same, processed_logprobs(logits, tokens, temperature=0.7, top_p=0.9))


def sample_call(
    model, rng: np.random.Generator, call_id: str, prompt: np.ndarray, n: int, t: float, p: float
):
    """n tokens sampled from the model's processed distribution at (t, p), with their behaviour logprobs."""
    ids, lps = prompt.astype(np.int64).tolist(), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            scaled = logits.double() / t
            probs, order = scaled.softmax(-1).sort(descending=True)
            keep = (probs.cumsum(-1) - probs) < p
            kept = torch.zeros_like(probs).scatter(0, order[keep], probs[keep])
            tok = int(rng.choice(len(kept), p=(kept / kept.sum()).numpy()))
            ids.append(tok)
            lps.append(reference_logprob(logits, tok, t, p))
    completion = np.asarray(ids[len(prompt) :], dtype=np.int32)
    return Call(call_id, "parent", "parent/c0", None, prompt.astype(np.int32), completion,
                np.asarray(lps, dtype=np.float32), temperature=t, top_p=p)  # fmt: skip


def test_on_policy_ratio_is_one_for_every_token_under_mixed_sampling(small_model_dir):
    model = load_policy(small_model_dir, CPU, trainable=False)
    rng = np.random.default_rng(3)
    settings = [(0.5, 1.0), (1.3, 0.8), (1.0, 1.0), (0.7, 0.9)]
    c0 = sample_call(model, rng, "parent/c0/000", rng.integers(3, 512, 6), 10, *settings[0])
    calls = [c0]
    for k, (t, p) in enumerate(settings[1:], start=1):
        head = calls[-1]
        prompt = np.concatenate([head.prompt, head.completion, rng.integers(3, 512, 2).astype(np.int32)])
        c = sample_call(model, rng, f"parent/c0/{k:03d}", prompt, 10, t, p)
        calls.append(dataclasses.replace(c, parent_call_id=head.call_id))
    rows = rows_from_calls(Episode("ep", "g", 1.0, calls))
    assert len(rows) == 1 and {(s.temperature, s.top_p) for s in rows[0].spans} == set(settings)
    [mb] = prepare_batch(rows, LearnerConfig()).plan
    expected_t = np.concatenate([np.full(c.completion.size, c.temperature) for c in calls])
    assert mb.temperature.numpy().tolist() == expected_t.tolist()
    ignored = LearnerConfig(temperature=1.3, top_p=0.5)  # only a RunConfig check: scoring never reads it
    ratio = torch.exp(score_tokens(model, mb, ignored, CPU) - mb.behavior_logprobs)
    assert ratio.numel() == 40
    assert float((ratio - 1).abs().max()) <= 2e-6, ratio
    # the same rows scored under one run-wide T=1.0 (not each span's own sampling) are far from on-policy
    flat = dataclasses.replace(
        mb, temperature=torch.ones_like(mb.temperature), top_p=torch.ones_like(mb.top_p)
    )
    off = torch.exp(score_tokens(model, flat, LearnerConfig(), CPU) - mb.behavior_logprobs)
    assert float((off - 1).abs().max()) > 0.05


def test_a_loss_span_without_mirrorable_sampling_is_refused():
    rng = np.random.default_rng(0)
    call = Call("parent/c0/000", "parent", "parent/c0", None, rng.integers(3, 50, 4).astype(np.int32),
                np.array([5, 6], np.int32), np.array([-1.0, -2.0], np.float32), temperature=0.5)  # fmt: skip
    [row] = rows_from_calls(Episode("ep", "g", 1.0, [call]))
    for bad in ({"temperature": None}, {"top_p": None}, {"top_p": 0.0}, {"temperature": 0.0}):
        span = dataclasses.replace(row.spans[0], **bad)
        with pytest.raises(SpanSamplingError, match="parent/c0/000"):
            validate_rows([dataclasses.replace(row, spans=(span,))])


def test_run_config_whose_learner_and_sampling_disagree_is_refused_naming_both():
    with pytest.raises(SamplingMismatchError, match=r"learner.temperature=1.0 but sampling.temperature=0.5"):
        RunConfig.model_validate(
            {"run_id": "r", "sampling": {"temperature": 0.5}, "learner": {"temperature": 1.0}}
        )
    with pytest.raises(SamplingMismatchError, match=r"learner.top_p=0.9 but sampling.top_p=1.0"):
        RunConfig(run_id="r", sampling=SamplingConfig(temperature=0.5), learner={"top_p": 0.9})
    assert RunConfig(run_id="r", sampling=SamplingConfig(temperature=0.5)).learner.temperature is None
    agreed = RunConfig(run_id="r", sampling=SamplingConfig(temperature=0.5), learner={"temperature": 0.5})
    assert agreed.learner.temperature == 0.5


@pytest.mark.parametrize(
    "name, value", [("top_k", 5), ("min_p", 0.1), ("repetition_penalty", 1.2), ("logit_bias", {1: 2})]
)
def test_sampling_that_the_learner_cannot_mirror_is_refused_by_name(name, value):
    with pytest.raises(UnmirrorableSamplingError, match=name):
        SamplingConfig.model_validate({name: value})
    with pytest.raises(UnmirrorableSamplingError, match=name):
        RunConfig.model_validate({"run_id": "r", "sampling": {"temperature": 0.5, name: value}})


def test_run_config_files_report_the_sampling_refusals_as_config_errors():
    from grove.runconfig import ConfigValidationError, validate_run_config

    with pytest.raises(ConfigValidationError, match=r"learner.temperature=1.0 but sampling.temperature=0.7"):
        validate_run_config(
            {"run_id": "r", "sampling": {"temperature": 0.7}, "learner": {"temperature": 1.0}}
        )
    with pytest.raises(ConfigValidationError, match="top_k=40"):
        validate_run_config({"run_id": "r", "sampling": {"top_k": 40}})
