"""The learner's loss and gradient equal a per-call reference built independently from the calls.

Reference (written here, sharing no code with trainer/): every eligible call is scored alone, its
own prompt as context and its own completion as action, one sequence at a time, with a top-p mask
computed the other way round (descending sort, exclusive cumulative mass < top_p) and advantages
computed from the episodes' rewards by the textbook formula. Each call is scored under its own
temperature/top_p (the sampling it was generated with; calls of one batch, even of one episode, may
differ). Loss and every parameter's gradient must agree to <= 1e-6 relative in float32. Then three
injected bugs (double-owned action, wrong denominator, shifted mask) must each break the agreement,
so the comparison can fail.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest
import torch

from bench.forests import Call, Episode, random_batch, rows_from_calls, with_mixed_sampling
from grove.learner_config import LearnerConfig
from trainer.batch import OwnershipError, plan_micro_batches, validate_rows
from trainer.learner import accumulate_gradients, load_policy, prepare_batch
from trainer.rows import Row

CPU = torch.device("cpu")
REL_TOL = 1e-6


# ---- the independent per-call reference ------------------------------------------------------------


def ref_advantages(episodes: list[Episode], std_scaling: bool, eps: float) -> dict[str, float]:
    rewards = defaultdict(list)
    for ep in episodes:
        if ep.valid:
            rewards[ep.group_id].append(ep.reward)
    out = {}
    for ep in episodes:
        r = rewards[ep.group_id]
        if not ep.valid or len(r) < 2:
            out[ep.episode_id] = 0.0
            continue
        mean = sum(r) / len(r)
        std = (sum((x - mean) ** 2 for x in r) / (len(r) - 1)) ** 0.5
        out[ep.episode_id] = (ep.reward - mean) / (std + eps) if std_scaling else ep.reward - mean
    return out


def ref_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float):
    scaled = logits.float() / temperature
    if top_p < 1.0:
        with torch.no_grad():
            probs, order = scaled.softmax(-1).sort(-1, descending=True)
            mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
            drop_sorted = mass_before >= top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = torch.where(drop, torch.full_like(scaled, float("-inf")), scaled)
    return torch.log_softmax(scaled, -1)[torch.arange(len(tokens)), tokens]


def per_call_reference(model, episodes: list[Episode], cfg: LearnerConfig, reference=None):
    """(loss, {param name: grad}) of the per-call objective."""
    adv = ref_advantages(episodes, cfg.adv_std_scaling, cfg.adv_eps)
    calls: list[tuple[Episode, Call]] = [
        (ep, c) for ep in episodes if ep.valid for c in ep.calls if c.eligible
    ]
    denominator = sum(c.completion.size for _, c in calls)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for ep, c in calls:
        seq = torch.from_numpy(np.concatenate([c.prompt, c.completion]).astype(np.int64))[None]
        p, n = c.prompt.size, c.completion.size
        target = torch.from_numpy(c.completion.astype(np.int64))
        logp = ref_logprobs(model(seq).logits[0, p - 1 : p - 1 + n], target, c.temperature, c.top_p)
        ratio = torch.exp(logp - torch.from_numpy(c.logprobs))
        a = adv[ep.episode_id]
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * a)
        per_token = -surrogate
        if cfg.kl_coef:
            with torch.no_grad():
                ref = ref_logprobs(
                    reference(seq).logits[0, p - 1 : p - 1 + n], target, c.temperature, c.top_p
                )
            per_token = per_token + cfg.kl_coef * (torch.exp(ref - logp) - (ref - logp) - 1)
        loss = per_token.sum() / denominator
        loss.backward()
        total += loss.item()
    return total, {k: v.grad.detach().clone() for k, v in model.named_parameters()}


# ---- the learner side ------------------------------------------------------------------------------


def learner_loss(model, rows: list[Row], cfg: LearnerConfig, reference=None, *, plan=None, denominator=None):
    batch = prepare_batch(rows, cfg)
    model.zero_grad(set_to_none=True)
    total = accumulate_gradients(
        model,
        plan if plan is not None else batch.plan,
        denominator if denominator is not None else batch.denominator,
        cfg,
        CPU,
        reference,
    )
    return total.loss, {k: v.grad.detach().clone() for k, v in model.named_parameters()}


def worst_relative(loss, grads, ref_loss, ref_grads) -> float:
    """The largest relative error: |loss - ref| / |ref|, and ||g - g_ref||_2 / ||g_ref||_2 per parameter.

    Per-parameter norms, not per element: an element of a sum with cancellation has no meaningful
    float32 relative error (the element-max version sits at float32's noise floor).
    """
    worst = abs(loss - ref_loss) / abs(ref_loss)
    for name, g in ref_grads.items():
        scale = float(g.norm())
        assert scale > 0, f"reference gradient of {name} is zero: the test would prove nothing"
        worst = max(worst, float((grads[name] - g).norm()) / scale)
    return worst


@pytest.fixture(scope="module")
def policy(small_model_dir):
    return load_policy(small_model_dir, CPU, trainable=True)


@pytest.fixture(scope="module")
def frozen_reference(small_model_dir):
    model = load_policy(small_model_dir, CPU, trainable=False)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is not ~0
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


# ---- the controlled episode: parent, two workers, a compaction, a kept fork, a retry ---------------


def controlled_batch(vocab: int) -> list[Episode]:
    rng = np.random.default_rng(7)

    def toks(n: int) -> np.ndarray:
        return rng.integers(3, vocab, size=n).astype(np.int32)

    def lp(n: int) -> np.ndarray:
        return -rng.uniform(0.1, 3.0, size=n).astype(np.float32)

    def call(cid, agent, ctx, parent, prompt, n, selected=True):
        return Call(cid, agent, ctx, parent.call_id if parent else None, prompt, toks(n), lp(n), selected)

    def ext(parent, cid, obs, n, selected=True):
        prompt = np.concatenate([parent.prompt, parent.completion, obs])
        return call(cid, parent.agent, parent.context_id, parent, prompt, n, selected)

    episodes = []
    for j, reward in enumerate([1.0, 0.0, 0.5]):
        p0 = call("parent/c0/000", "parent", "parent/c0", None, toks(9), 5)
        w1 = call("worker-1/c0/000", "worker-1", "worker-1/c0", None, toks(6), 4)
        w1b = ext(w1, "worker-1/c0/001", toks(2), 6)
        p1 = ext(p0, "parent/c0/001", np.concatenate([toks(1), w1b.completion]), 4)
        retry = ext(p1, "parent/c0/002", toks(2), 3, selected=False)
        p2 = ext(p1, "parent/c0/003", toks(2), 5)  # kept fork: p2 and p3 both extend p1
        p3 = ext(p1, "parent/c0/004", toks(3), 4)
        w2 = call("worker-2/c0/000", "worker-2", "worker-2/c0", None, toks(5), 7)
        p4 = ext(p3, "parent/c0/005", np.concatenate([toks(2), w2.completion]), 3)
        c1 = call("parent/c1/000", "parent", "parent/c1", None, np.concatenate([toks(3), p4.completion]), 6)
        c2 = ext(c1, "parent/c1/001", toks(2), 5)
        calls = [p0, w1, w1b, p1, retry, p2, p3, w2, p4, c1, c2]
        episodes.append(Episode(f"ctrl-{j}", "group-ctrl", reward, calls))
    return episodes


def rows_of(episodes: list[Episode]) -> list[Row]:
    return [r for ep in episodes for r in rows_from_calls(ep)]


# ---- agreement -------------------------------------------------------------------------------------


def test_controlled_episode_matches_per_call_reference(policy):
    episodes = controlled_batch(policy.config.vocab_size)
    rows = rows_of(episodes)
    assert any(not s.owned and s.eligible for r in rows for s in r.spans), "needs shared conditioning"
    cfg = LearnerConfig(micro_batch_tokens=64)  # several micro-batches
    loss, grads = learner_loss(policy, rows, cfg)
    ref_loss, ref_grads = per_call_reference(policy, episodes, cfg)
    assert worst_relative(loss, grads, ref_loss, ref_grads) <= REL_TOL


# Per-call sampling settings mixed inside one batch (and inside episodes): the gateway lets every
# request choose its temperature/top_p.
MIXED = [(1.0, 1.0), (0.5, 1.0), (0.7, 0.9), (1.3, 0.8), (0.5, 0.95)]

# The learner (tree/packed layouts, chunked head) and the per-call reference compute each logit with
# other matmuls: they agree to ~1e-6 relative in float32, and a top-p set decided within that of its
# boundary may differ between them on one CPU and not on another (one token more or less in a
# normaliser: a 1e-5 .. 1e-4 relative gradient difference). `separated_sampling` moves each call's
# top_p (by at most 0.05) to where, at every position of the call, 1 - top_p is at least SEP_MASS from
# every cumulative mass and the last kept and first dropped scaled logits differ by at least SEP_LOGIT:
# 100x the disagreement, so the comparison holds on any CPU at REL_TOL.
SEP_MASS, SEP_LOGIT = 1e-4, 1e-4


def _separated_top_p(model, call: Call) -> float:
    seq = torch.from_numpy(np.concatenate([call.prompt, call.completion]).astype(np.int64))[None]
    p, n = call.prompt.size, call.completion.size
    with torch.no_grad():
        scaled = model(seq).logits[0, p - 1 : p - 1 + n].double() / call.temperature
    probs, order = scaled.softmax(-1).sort(-1, descending=True)
    logits = scaled.gather(-1, order)
    mass = probs.cumsum(-1)  # mass[:, m]: the top m + 1 tokens
    best, best_margin = None, 0.0
    for cand in np.linspace(max(0.05, call.top_p - 0.05), min(0.999, call.top_p + 0.05), 401):
        m = (mass < cand).sum(-1)  # index of the least likely kept token
        above = mass.gather(-1, m[:, None]).squeeze(-1) - cand
        below = cand - torch.where(m > 0, mass.gather(-1, (m - 1).clamp(min=0)[:, None]).squeeze(-1), 0.0)
        nxt = (m + 1).clamp(max=scaled.shape[1] - 1)
        gap = logits.gather(-1, m[:, None]) - logits.gather(-1, nxt[:, None])
        margin = float(torch.minimum(above, below).min())
        if bool((gap > SEP_LOGIT).all()) and margin > max(SEP_MASS, best_margin):
            best, best_margin = float(cand), margin
    assert best is not None, f"call {call.call_id}: no top_p near {call.top_p} is separated enough"
    return best


def separated_sampling(model, episodes: list[Episode]) -> list[Episode]:
    """The episodes with each top_p < 1 call's top_p moved off its boundaries (see SEP_MASS)."""
    return [
        dataclasses.replace(
            ep,
            calls=[
                dataclasses.replace(c, top_p=_separated_top_p(model, c)) if c.top_p < 1.0 else c
                for c in ep.calls
            ],
        )
        for ep in episodes
    ]


@pytest.mark.parametrize(
    "seed, knobs, settings",
    [
        (1, {}, None),
        (2, {"adv_std_scaling": False, "micro_batch_tokens": 1}, MIXED),
        (3, {"clip_low": 0.1, "clip_high": 0.3}, [(0.7, 0.9)]),
        (4, {"micro_batch_tokens": 100_000}, MIXED),
        (7, {"micro_batch_tokens": 64}, MIXED),
    ],
)
def test_random_forests_match_per_call_reference(policy, seed, knobs, settings):
    episodes = random_batch(seed, vocab=policy.config.vocab_size, groups=2, group_size=3, size=4)
    if settings is not None:
        episodes = separated_sampling(policy, with_mixed_sampling(episodes, settings, seed))
    cfg = LearnerConfig(**knobs)
    loss, grads = learner_loss(policy, rows_of(episodes), cfg)
    ref_loss, ref_grads = per_call_reference(policy, episodes, cfg)
    assert worst_relative(loss, grads, ref_loss, ref_grads) <= REL_TOL


def test_mixed_sampling_batch_is_scored_per_span_not_per_run(policy):
    """Calls sampled at different temperatures/top-p in one episode: each is scored under its own.

    The learner agrees with the per-call reference, and disagrees with a reference that scores every
    call under one run-wide setting (what a single learner temperature would compute), so the
    agreement is not an accident of the settings being irrelevant.
    """
    episodes = separated_sampling(
        policy,
        with_mixed_sampling(
            random_batch(11, vocab=policy.config.vocab_size, groups=2, group_size=3, size=4), MIXED, 11
        ),
    )
    per_episode = [{(c.temperature, c.top_p) for c in ep.calls if c.eligible} for ep in episodes]
    assert max(len(s) for s in per_episode) >= 3, "needs several settings inside one episode"
    cfg = LearnerConfig(micro_batch_tokens=96)
    loss, grads = learner_loss(policy, rows_of(episodes), cfg)
    ref_loss, ref_grads = per_call_reference(policy, episodes, cfg)
    assert worst_relative(loss, grads, ref_loss, ref_grads) <= REL_TOL
    one_setting = [
        dataclasses.replace(ep, calls=[dataclasses.replace(c, temperature=1.0, top_p=1.0) for c in ep.calls])
        for ep in episodes
    ]
    run_wide_loss, run_wide_grads = per_call_reference(policy, one_setting, cfg)
    assert worst_relative(loss, grads, run_wide_loss, run_wide_grads) > 1e-3


def test_kl_to_reference_matches_per_call_reference(policy, frozen_reference):
    episodes = with_mixed_sampling(
        # top_p 1 only: random tokens outside a top-p set have logprob -inf, and the KL term of -inf is NaN
        random_batch(5, vocab=policy.config.vocab_size, groups=2, group_size=2, size=3),
        [(1.0, 1.0), (0.5, 1.0), (1.3, 1.0)],
        5,
    )
    cfg = LearnerConfig(kl_coef=0.5, micro_batch_tokens=128)
    loss, grads = learner_loss(policy, rows_of(episodes), cfg, frozen_reference)
    ref_loss, ref_grads = per_call_reference(policy, episodes, cfg, frozen_reference)
    assert worst_relative(loss, grads, ref_loss, ref_grads) <= REL_TOL


def test_invalid_episode_and_singleton_group_match_reference(policy):
    episodes = random_batch(6, vocab=policy.config.vocab_size, groups=2, group_size=3, size=3)
    episodes[1].valid = False  # a failed episode: no loss, not in the baseline
    episodes[3].group_id = "group-alone"  # a singleton group: advantage 0, tokens still counted
    cfg = LearnerConfig()
    loss, grads = learner_loss(policy, rows_of(episodes), cfg)
    ref_loss, ref_grads = per_call_reference(policy, episodes, cfg)
    assert worst_relative(loss, grads, ref_loss, ref_grads) <= REL_TOL


# ---- the comparison catches injected bugs -----------------------------------------------------------


def _double_own(rows: list[Row]) -> list[Row]:
    """Give loss to an eligible call in a second row where it is only conditioning."""
    for i, row in enumerate(rows):
        for k, s in enumerate(row.spans):
            if s.eligible and not s.owned:
                owner = next(
                    r
                    for r in rows
                    if any(t.call_id == s.call_id and t.owned for t in r.spans)
                    and r.episode_id == row.episode_id
                )
                src = next(t for t in owner.spans if t.call_id == s.call_id)
                mask, blp = row.loss_mask.copy(), row.behavior_logprobs.copy()
                mask[s.start : s.end] = True
                blp[s.start : s.end] = owner.behavior_logprobs[src.start : src.end]
                spans = list(row.spans)
                spans[k] = dataclasses.replace(s, owned=True)
                bad = dataclasses.replace(row, loss_mask=mask, behavior_logprobs=blp, spans=tuple(spans))
                return rows[:i] + [bad] + rows[i + 1 :]
    raise AssertionError("no shared eligible call to double-own")


def _shift_mask(rows: list[Row]) -> list[Row]:
    """Off by one: loss on the token after each action token (as if scored with the logits at t)."""
    out = []
    for row in rows:
        mask = np.zeros_like(row.loss_mask)
        mask[1:] = row.loss_mask[:-1]
        mask[-1] |= row.loss_mask[-1]
        blp = np.zeros_like(row.behavior_logprobs)
        blp[mask] = row.behavior_logprobs[row.loss_mask][: int(mask.sum())]
        out.append(dataclasses.replace(row, loss_mask=mask, behavior_logprobs=blp))
    return out


def corrupted_plan(bad: list[Row], episodes: list[Episode], cfg: LearnerConfig):
    """Micro-batches of corrupted rows (no validation), with the correct episodes' advantages."""
    advantages = {e: a.advantage for e, a in prepare_batch(rows_of(episodes), cfg).advantages.items()}
    return plan_micro_batches(bad, advantages, cfg.micro_batch_tokens)


@pytest.fixture(scope="module")
def agreed(policy):
    episodes = controlled_batch(policy.config.vocab_size)
    cfg = LearnerConfig(micro_batch_tokens=64)
    return episodes, cfg, per_call_reference(policy, episodes, cfg)


def test_double_owned_action_is_caught(policy, agreed):
    episodes, cfg, (ref_loss, ref_grads) = agreed
    bad = _double_own(rows_of(episodes))
    with pytest.raises(OwnershipError, match="owned by 2 rows"):
        validate_rows(bad)
    plan = corrupted_plan(bad, episodes, cfg)  # the right denominator, the corrupted plan
    loss, grads = learner_loss(policy, rows_of(episodes), cfg, plan=plan)
    assert worst_relative(loss, grads, ref_loss, ref_grads) > 1e-3


@pytest.mark.parametrize("kind", ["per_row_occurrence", "per_micro_batch"])
def test_wrong_denominator_is_caught(policy, agreed, kind):
    episodes, cfg, (ref_loss, ref_grads) = agreed
    rows = rows_of(episodes)
    batch = prepare_batch(rows, cfg)
    if kind == "per_row_occurrence":  # counts an action again in every row that contains it
        wrong = sum(s.end - s.start for r in rows for s in r.spans if s.eligible)
        assert wrong != batch.denominator
        loss, grads = learner_loss(policy, rows, cfg, denominator=wrong)
    else:  # each micro-batch normalised by its own tokens: accumulation no longer equals one batch
        assert len(batch.plan) > 1
        policy.zero_grad(set_to_none=True)
        loss = sum(accumulate_gradients(policy, [mb], len(mb.advantages), cfg, CPU).loss for mb in batch.plan)
        grads = {k: v.grad.detach().clone() for k, v in policy.named_parameters()}
    assert worst_relative(loss, grads, ref_loss, ref_grads) > 1e-3


def test_shifted_mask_is_caught(policy, agreed):
    episodes, cfg, (ref_loss, ref_grads) = agreed
    bad = _shift_mask(rows_of(episodes))
    plan = corrupted_plan(bad, episodes, cfg)
    loss, grads = learner_loss(policy, rows_of(episodes), cfg, plan=plan)
    assert worst_relative(loss, grads, ref_loss, ref_grads) > 1e-3


def test_reference_itself_is_sensitive_to_the_ratio(policy, agreed):
    """Sanity: moving one behaviour logprob changes the reference by far more than the tolerance."""
    episodes, cfg, (ref_loss, ref_grads) = agreed
    ep = episodes[0]
    c = next(c for c in ep.calls if c.eligible)
    moved = dataclasses.replace(c, logprobs=c.logprobs - np.float32(0.1))
    changed = [Episode(ep.episode_id, ep.group_id, ep.reward, [moved if x is c else x for x in ep.calls])]
    loss, grads = per_call_reference(policy, changed + episodes[1:], cfg)
    assert worst_relative(loss, grads, ref_loss, ref_grads) > 1e-4
