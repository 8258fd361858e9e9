"""`grove run check` / `grove episode check` (cli/row_audit.py): an episode written out by hand — a lead
that spawns a worker, the worker compacted (an auxiliary summary call, then a rewrite) — whose rows are
laid out here token by token from the served calls, passes; each single corruption of its rows, links or
result is reported, in words naming the row or call."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from capture.call_archive import ArchivedCall, CallArchive
from cli.row_audit import audit_episode
from grove.contracts import EpisodeResult
from grove.receipts import CallKind, CallReceipt, CallState, ContextOrigin, ContextRecord
from grove.sampling import SamplingProcessing
from trainer.rows import Row, Span

T07 = SamplingProcessing(temperature=0.7, top_p=1.0)
# call id -> (agent, kind, state, prompt, completion, logprobs)
CALLS = {
    "lead.0.c0": ("lead", CallKind.ACTION, CallState.SELECTED, [1, 2, 3], [10, 11], [-0.1, -0.2]),
    "lead.0.c1": ("lead", CallKind.ACTION, CallState.SELECTED, [1, 2, 3, 10, 11, 20, 21], [12], [-0.3]),
    "w.0.c0": ("w", CallKind.ACTION, CallState.SELECTED, [5, 6], [30, 31, 32], [-1.0, -1.5, -2.0]),
    "w~summary.0.c0": (
        "w~summary",
        CallKind.SUMMARY,
        CallState.AUXILIARY,
        [5, 6, 30, 31, 32, 99],
        [40],
        [-0.5],
    ),
    "w.1.c0": ("w", CallKind.ACTION, CallState.SELECTED, [7, 40], [33], [-0.25]),
    "lead.0.c2": ("lead", CallKind.ACTION, CallState.DISCARDED, [1, 2, 3, 10, 11], [13], [-4.0]),
}
CONTEXTS = [
    ContextRecord(context_id="lead.0", agent="lead", origin=ContextOrigin.ROOT),
    ContextRecord(context_id="w.0", agent="w", origin=ContextOrigin.SPAWN, spawned_by_call="lead.0.c0"),
    ContextRecord(context_id="w~summary.0", agent="w~summary", origin=ContextOrigin.ROOT),
    ContextRecord(context_id="w.1", agent="w", origin=ContextOrigin.REWRITE, rewrite_of="w.0"),
]


def archive(contexts=CONTEXTS, calls=CALLS) -> CallArchive:
    archived = []
    for cid, (agent, kind, state, prompt, completion, logprobs) in calls.items():
        receipt = CallReceipt(call_id=cid, context_id=cid.rsplit(".", 1)[0], agent=agent, kind=kind,
                              state=state, policy_version=3, sampling=T07)  # fmt: skip
        archived.append(ArchivedCall(receipt=receipt, prompt_len=len(prompt), prompt_tail_ids=prompt[-96:],
                                     completion_ids=completion, logprobs=logprobs))  # fmt: skip
    return CallArchive(episode_id="ep", group_id="g", contexts=contexts, calls=archived)


def row(endpoint: str, ids: list[int], spans: list[tuple[str, int, int, bool]]) -> Row:
    """A row laid out by hand: `spans` are (call, start, end, owned); loss and logprobs on owned spans."""
    mask = np.zeros(len(ids), bool)
    lp = np.zeros(len(ids), np.float32)
    out = []
    for cid, start, end, owned in spans:
        agent = CALLS[cid][0]
        out.append(Span(cid, agent, start, end, owned, owned, 3, 0.7, 1.0))
        if owned:
            mask[start:end] = True
            lp[start:end] = CALLS[cid][5]
    return Row(row_id=f"ep#{endpoint}", episode_id="ep", group_id="g", input_ids=np.array(ids, np.int32),
               loss_mask=mask, behavior_logprobs=lp, spans=tuple(out), reward=0.5)  # fmt: skip


def rows() -> list[Row]:
    return [
        row(
            "lead.0.c1", [1, 2, 3, 10, 11, 20, 21, 12], [("lead.0.c0", 3, 5, True), ("lead.0.c1", 7, 8, True)]
        ),
        row("w.0.c0", [5, 6, 30, 31, 32], [("w.0.c0", 2, 5, True)]),
        row("w.1.c0", [7, 40, 33], [("w.1.c0", 2, 3, True)]),
    ]


def result(**changes) -> EpisodeResult:
    counts = {"selected": 4, "auxiliary": 1, "discarded": 1}
    fields = dict(episode_id="ep", group_id="g", task_id="t", status="ok", reward=0.5, rows_key="k",
                  num_rows=3, eligible_tokens=7, counts=counts)  # fmt: skip
    return EpisodeResult(**(fields | changes))


def test_an_episode_whose_rows_are_its_served_calls_passes_and_is_counted():
    audit = audit_episode(archive(), rows(), result())
    assert audit.violations == []
    assert (audit.rows, audit.trained_calls, audit.trained_tokens) == (3, 4, 7)
    assert (audit.contexts["spawn"], audit.contexts["rewrite"], audit.summaries, audit.summaries_trained) == (
        1, 1, 1, 0,
    )  # fmt: skip
    assert audit.line().startswith("ok   ep  rows 3  calls 6")


def _with_ids(r: Row, position: int, value: int) -> Row:
    ids = r.input_ids.copy()
    ids[position] = value
    return dataclasses.replace(r, input_ids=ids)


def _with_mask(r: Row, position: int) -> Row:
    mask = r.loss_mask.copy()
    mask[position] = True
    return dataclasses.replace(r, loss_mask=mask)


def _with_span(r: Row, i: int, **changes) -> Row:
    spans = list(r.spans)
    spans[i] = dataclasses.replace(spans[i], **changes)
    return dataclasses.replace(r, spans=tuple(spans))


def _with_logprob(r: Row, position: int, value: float) -> Row:
    lp = r.behavior_logprobs.copy()
    lp[position] = value
    return dataclasses.replace(r, behavior_logprobs=lp)


def _twice(rs: list[Row]) -> list[Row]:
    return [*rs, row("w.0.c0-again", [5, 6, 30, 31, 32], [("w.0.c0", 2, 5, True)])]


def _summary_trained(rs: list[Row]) -> list[Row]:
    return [*rs, row("w~summary.0.c0", [5, 6, 30, 31, 32, 99, 40], [("w~summary.0.c0", 6, 7, True)])]


def _discarded_used(rs: list[Row]) -> list[Row]:
    spans = [("lead.0.c0", 3, 5, False), ("lead.0.c2", 5, 6, False)]
    return [*rs, row("lead.0.c2", [1, 2, 3, 10, 11, 13], spans)]


CORRUPTIONS = {
    "a completion token": (lambda rs: [_with_ids(rs[0], 4, 99), *rs[1:]], "not the completion the engine"),
    "a prompt token": (lambda rs: [_with_ids(rs[0], 1, 99), *rs[1:]], "not the prompt it was served"),
    "loss on an observation": (lambda rs: [_with_mask(rs[0], 5), *rs[1:]], "loss mask differs"),
    "a call trained twice": (_twice, "owned by 2 rows, expected 1"),
    "a call never trained": (lambda rs: rs[:2], "w.1.c0 (selected, action, agent w): owned by 0 rows"),
    "a summary trained unasked": (_summary_trained, "w~summary.0.c0 (auxiliary, summary, agent w~summary)"),
    "a discarded call in a row": (_discarded_used, "a discarded call in a row"),
    "another temperature": (lambda rs: [rs[0], _with_span(rs[1], 0, temperature=1.0), rs[2]], "ature 1.0"),
    "a wrong span start": (lambda rs: [rs[0], _with_span(rs[1], 0, start=1), rs[2]], "starts at 1, its"),
    "a logprob": (lambda rs: [rs[0], rs[1], _with_logprob(rs[2], 2, -0.5)], "served ones by up to 0.25"),
    "another reward": (lambda rs: [dataclasses.replace(rs[0], reward=0.0), *rs[1:]], "the episode's 0.5"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_corruption_of_the_rows_is_reported(name):
    corrupt, says = CORRUPTIONS[name]
    audit = audit_episode(archive(), corrupt(rows()), result())
    assert not audit.ok and audit.line().startswith("FAIL")
    assert any(says in v for v in audit.violations), audit.violations


def test_broken_links_and_a_result_that_disagrees_are_reported():
    orphan = CONTEXTS[1].model_copy(update={"spawned_by_call": "lead.0.c9"})
    foreign = ContextRecord(context_id="w.1", agent="w", origin=ContextOrigin.REWRITE, rewrite_of="lead.0")
    audit = audit_episode(
        archive([CONTEXTS[0], orphan, CONTEXTS[2], foreign]), rows(), result(eligible_tokens=6)
    )
    said = "\n".join(audit.violations)
    assert "context w.0: spawned by call 'lead.0.c9', which the archive does not hold" in said
    assert "context w.1: rewrites 'lead.0', which is no context of agent 'w'" in said
    assert "rows train 7 tokens, the episode's result says 6" in said


def test_a_parent_only_episode_trains_the_lead_alone():
    audit = audit_episode(archive(), rows(), result(), train_agents="parent_only")
    assert sorted(v.split(" (")[0] for v in audit.violations if "owned by 1 rows, expected 0" in v) == [
        "call w.0.c0", "call w.1.c0",
    ]  # fmt: skip
    lead_only = [rows()[0], *(dataclasses.replace(
        r, loss_mask=np.zeros_like(r.loss_mask), behavior_logprobs=np.zeros_like(r.behavior_logprobs),
        spans=tuple(dataclasses.replace(s, owned=False, eligible=False) for s in r.spans),
    ) for r in rows()[1:])]  # fmt: skip
    assert audit_episode(archive(), lead_only, result(eligible_tokens=3), train_agents="parent_only").ok


def test_a_run_that_trains_summaries_must_train_each_once():
    missing = audit_episode(archive(), rows(), result(), train_auxiliary=["summary"])
    assert any("call w~summary.0.c0" in v and "owned by 0 rows, expected 1" in v for v in missing.violations)
    summary = row("w~summary.0.c0", [5, 6, 30, 31, 32, 99, 40], [("w~summary.0.c0", 6, 7, True)])
    audit = audit_episode(
        archive(), [*rows(), summary], result(eligible_tokens=8), train_auxiliary=["summary"]
    )
    assert audit.ok, audit.violations
    assert audit.summaries_trained == 1


def test_a_failed_episodes_placeholder_row_carries_no_loss():
    one = np.zeros(1, np.int32)
    mask, lp = one.astype(bool), one.astype(np.float32)
    placeholder = Row(row_id="ep#placeholder", episode_id="ep", group_id="g", input_ids=one, loss_mask=mask,
                      behavior_logprobs=lp, valid=False)  # fmt: skip
    failed = result(status="failed", eligible_tokens=0, num_rows=1)
    audit = audit_episode(archive(), [placeholder], failed)
    assert audit.ok, audit.violations
    assert (audit.trained_tokens, audit.summaries, audit.summaries_trained) == (0, 1, 0)
    lossy = dataclasses.replace(placeholder, loss_mask=np.ones(1, bool))
    said = audit_episode(archive(), [lossy], failed).violations
    assert any("a failed episode's placeholder row with loss tokens" in v for v in said)
