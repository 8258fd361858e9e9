"""Summary calls as trained actions, seen from the rows the learner checks and the tokens it trains.

One GRPO group of two episodes (rewards 1 and 0), each holding a compaction in every harness shape the
ledger sees, driven through the real Ledger with hand-written token arrays:

    worker-1  native `compact`: the summary call extends the agent's own context, then a declared rewrite
    worker-2  OpenCode: the summary call in `worker-2~summary`, the rewrite holds it as an assistant turn
    worker-3  LangGraph SummarizationMiddleware: `worker-3~summary`, the rewrite holds it in a user turn
    worker-4  Agents SDK input filter: `worker-4~summary`, the same
    parent    a wire format's header (`x-grove-call-kind: summary`, as Claude Code / Codex adapters send):
              compacts twice, its second summary context a rewrite of the first; plus a title call

Every summary completion uses token ids of its own (>= 500, written out below), so the expectations are
counts of ids under loss, written by hand, never derived from spans or the reconstruction's accounting.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from grove.contracts import UnknownAuxiliaryKindError, UntrainableAuxiliaryKindError
from grove.episodes import EpisodeRecord
from grove.receipts import CallKind
from grove.sampling import SamplingProcessing
from tests.forest.kit import Episode, tokens
from trainer.advantages import episode_advantages
from trainer.batch import plan_micro_batches, validate_rows
from trainer.forest import ReconstructionOptions

SUMMARY_SAMPLED = SamplingProcessing(temperature=0.8, top_p=0.9)  # unlike the actions' 1.0 / 1.0
# summary call -> (completion ids, behaviour logprobs): the tokens that are trained once, or never
SUMMARIES = {
    "w1s": ([501, 502], [-0.51, -0.52]),
    "s2": ([511, 512, 513], [-0.61, -0.62, -0.63]),
    "s3": ([521], [-0.71]),
    "s4": ([531, 532], [-0.81, -0.82]),
    "ps1": ([541, 542], [-0.91, -0.92]),
    "ps2": ([551], [-0.95]),
}
PARENT_SUMMARY_IDS = {541, 542, 551}
TITLE_ID = 561
ALL_SUMMARY_IDS = {i for ids, _ in SUMMARIES.values() for i in ids}
LOGPROB_OF = {i: lp for ids, lps in SUMMARIES.values() for i, lp in zip(ids, lps, strict=True)}
# rewards 1 and 0: mean 0.5, sample std sqrt(0.5); A = +-0.5 / (sqrt(0.5) + 1e-6)
ADVANTAGE = {"ep-a": 0.5 / (0.5**0.5 + 1e-6), "ep-b": -0.5 / (0.5**0.5 + 1e-6)}


def summary(
    ep: Episode, call_id: str, context_id: str, prompt: list[int], extends: str | None = None
) -> None:
    ids, lps = SUMMARIES[call_id]
    ep.call(
        call_id,
        context_id,
        tokens(prompt, ids, lps),
        extends,
        kind=CallKind.SUMMARY,
        sampling=SUMMARY_SAMPLED,
    )


def aux_summary_worker(ep: Episode, n: int, call_id: str, rewrite_prompt: list[int]) -> None:
    """OpenCode / LangGraph / Agents SDK: the summary call in the agent's `~summary` context."""
    agent, base = f"worker-{n}", 10 * n
    ep.spawn(f"{agent}.0", agent, by="p1")
    ep.call(f"w{n}a", f"{agent}.0", tokens([base, base + 1], [base + 2], [-0.3]))
    ep.root(f"{agent}~summary.0", f"{agent}~summary")
    summary(ep, call_id, f"{agent}~summary.0", [90, base, base + 1, base + 2])
    ep.rewrite(f"{agent}.1", agent, of=f"{agent}.0")
    ep.call(f"w{n}b", f"{agent}.1", tokens(rewrite_prompt, [base + 3], [-0.4]))


def episode(episode_id: str) -> Episode:
    ep = Episode(episode_id=episode_id, group_id="grp")
    ep.root("parent.0", "parent")
    ep.call("p1", "parent.0", tokens([1, 2], [3, 4], [-0.1, -0.2]))
    # native: the summary call continues worker-1's own context; its rewrite starts from the summary
    ep.spawn("worker-1.0", "worker-1", by="p1")
    ep.call("w1a", "worker-1.0", tokens([10, 11], [12], [-0.3]))
    summary(ep, "w1s", "worker-1.0", [10, 11, 12, 13], extends="w1a")
    ep.rewrite("worker-1.1", "worker-1", of="worker-1.0")
    ep.call("w1b", "worker-1.1", tokens([10, 14, 501, 502, 15], [16], [-0.4]))
    aux_summary_worker(ep, 2, "s2", [20, 91, 511, 512, 513, 92])  # OpenCode: [sys, Q, summary, Continue]
    aux_summary_worker(ep, 3, "s3", [30, 93, 521, 31])  # LangGraph: [sys, "Here is a summary" + it, msg]
    aux_summary_worker(ep, 4, "s4", [40, 94, 531, 532])  # Agents SDK filter: [summary, recent]
    # the lead compacts twice through a wire format's summary header, then answers; a title on the side
    ep.root("parent~summary.0", "parent~summary")
    summary(ep, "ps1", "parent~summary.0", [95, 1, 2, 3, 4])
    ep.rewrite("parent.1", "parent", of="parent.0")
    ep.call("p2", "parent.1", tokens([1, 541, 542, 6], [7], [-0.2]))
    ep.rewrite("parent~summary.1", "parent~summary", of="parent~summary.0")
    summary(ep, "ps2", "parent~summary.1", [95, 1, 541, 542, 6, 7])
    ep.rewrite("parent.2", "parent", of="parent.1")
    ep.call("p3", "parent.2", tokens([1, 551, 8, 16, 23, 33, 43], [9], [-0.2]))
    ep.root("parent~title.0", "parent~title")
    ep.call("t1", "parent~title.0", tokens([96, 1], [TITLE_ID], [-0.99]), kind=CallKind.TITLE)
    ep.close()
    return ep


def trained(options: ReconstructionOptions):
    """The group's rows (checked as the learner checks them) and its loss tokens as the learner sees
    them: (episode, token id, advantage, behaviour logprob, temperature, top_p) per loss token."""
    rows, records = [], []
    for episode_id, reward in (("ep-a", 1.0), ("ep-b", 0.0)):
        rec = episode(episode_id).reconstruct(options, reward=reward)
        rows += rec.rows
        records.append(
            EpisodeRecord(
                episode_id=episode_id, group_id="grp", reward=reward, status="ok", num_rows=len(rec.rows)
            )
        )
    validate_rows(rows)  # each eligible call owned by exactly one row, masks = owned eligible spans
    advantages = {e: a.advantage for e, a in episode_advantages(rows, records).items()}
    tokens_out = []
    for mb in plan_micro_batches(rows, advantages, budget=10_000):
        ids = mb.input_ids[mb.loss_rows, mb.loss_positions].tolist()
        episodes = [mb.row_ids[int(b)].split("#")[0] for b in mb.loss_rows]
        tokens_out += zip(
            episodes, ids, mb.advantages.tolist(), mb.behavior_logprobs.tolist(), mb.temperature.tolist(),
            mb.top_p.tolist(), strict=True,
        )  # fmt: skip
    return rows, tokens_out


def summary_loss_ids(loss_tokens) -> Counter:
    return Counter((e, i) for e, i, *_ in loss_tokens if i >= 500)


def test_with_summaries_trained_every_summary_token_is_trained_once_under_its_episodes_advantage():
    rows, loss_tokens = trained(ReconstructionOptions(train_auxiliary=["summary"]))
    want = Counter({(e, i): 1 for e in ADVANTAGE for i in ALL_SUMMARY_IDS})
    assert summary_loss_ids(loss_tokens) == want  # every summary token of every shape, exactly once
    for e, i, advantage, logprob, temperature, top_p in loss_tokens:
        assert advantage == pytest.approx(ADVANTAGE[e], rel=1e-12)  # one advantage per episode
        if i in ALL_SUMMARY_IDS:  # mirrored as sampled: its logprob, its temperature and top-p
            assert logprob == pytest.approx(LOGPROB_OF[i], abs=1e-6)
            assert (temperature, top_p) == pytest.approx((0.8, 0.9))
        else:
            assert (temperature, top_p) == (1.0, 1.0)
    # the rewrites keep each summary as conditioning: present in a later row without loss
    for i in ALL_SUMMARY_IDS:
        unmasked = sum(int(((r.input_ids == i) & ~r.loss_mask).sum()) for r in rows if r.episode_id == "ep-a")
        assert unmasked >= 1, f"summary token {i} is not conditioning in any rewrite row"


def test_with_summaries_not_trained_no_summary_token_is_trained_and_actions_still_are():
    rows, loss_tokens = trained(ReconstructionOptions())
    assert summary_loss_ids(loss_tokens) == Counter()
    # the actions before each compaction still train once, the native one in the row its summary ends
    action_ids = Counter((e, i) for e, i, *_ in loss_tokens)
    for e in ADVANTAGE:
        for i in (3, 4, 7, 9, 12, 16, 22, 23, 32, 33, 42, 43):
            assert action_ids[(e, i)] == 1, (e, i)
    assert all(r.loss_mask[np.isin(r.input_ids, list(ALL_SUMMARY_IDS))].sum() == 0 for r in rows)


def test_a_parent_only_run_trains_only_the_parents_summaries():
    _, loss_tokens = trained(ReconstructionOptions(train_agents="parent_only", train_auxiliary=["summary"]))
    want = Counter({(e, i): 1 for e in ADVANTAGE for i in PARENT_SUMMARY_IDS})
    assert summary_loss_ids(loss_tokens) == want


def test_the_title_is_never_trained_and_cannot_be_asked_for():
    for options in (ReconstructionOptions(), ReconstructionOptions(train_auxiliary=["summary"])):
        _, loss_tokens = trained(options)
        assert all(i != TITLE_ID for _, i, *_ in loss_tokens)
    with pytest.raises(UntrainableAuxiliaryKindError, match="'title' calls are never trained"):
        ReconstructionOptions(train_auxiliary=["title"])
    with pytest.raises(UnknownAuxiliaryKindError, match="'caption' is not an auxiliary call kind"):
        ReconstructionOptions(train_auxiliary=["caption"])


def test_the_accounting_counts_the_summaries_trained():
    on = episode("ep-a").reconstruct(ReconstructionOptions(train_auxiliary=["summary"])).accounting
    off = episode("ep-a").reconstruct(ReconstructionOptions()).accounting
    assert on.summary_calls == off.summary_calls == ["ps1", "ps2", "s2", "s3", "s4", "w1s"]
    assert (len(on.summary_calls_trained), on.summary_tokens_trained) == (6, 11)
    assert (len(off.summary_calls_trained), off.summary_tokens_trained) == (0, 0)
