"""Settled calls (a restore per run bounded by the live calls): a long episode's hand-over drops every call
older than its context's branch window from the ledger (`Ledger.settle`), after writing it to the ledger
pages.

The reference in every test is the same episode in a ledger that never settles: the settled ledger must
answer exactly as it does (summary, heads, states, duplicate ids, close counts, last outputs), or refuse
with SettledCallError *before* anything changes, and the pages written before each settle must join to the
reference ledger (what materialize reads). Pure: no services.
"""

from __future__ import annotations

import random

import pytest

from grove.receipts import CallKind, CallState, ContextOrigin, ContextRecord, TokenDigests
from ledger.errors import DuplicateCallError, LedgerError, SettledCallError
from ledger.handover import changed_pages, join_pages
from ledger.ledger import Ledger
from ledger.settled import IdRanges, canonical_index


def _digests(i: int, prompt_len: int) -> TokenDigests:
    return TokenDigests(prompt_len=prompt_len, completion_len=3, prompt_sha256=f"p{i}",
                        completion_sha256=f"c{i}", logprobs_sha256=f"l{i}")  # fmt: skip


def _complete(ledger: Ledger, call_id: str, i: int = 0) -> None:
    receipt = ledger.calls[call_id]
    parent = ledger.calls.get(receipt.parent_call_id) if receipt.parent_call_id else None
    need = 0 if parent is None else parent.digests.prompt_len + parent.digests.completion_len
    ledger.complete(call_id, f"staging/{call_id}", _digests(i, need + 2), 0, "length")


def _root(ledger: Ledger, context_id: str = "parent") -> None:
    ledger.open_context(ContextRecord(context_id=context_id, agent=context_id, origin=ContextOrigin.ROOT))


def _line(n: int, context_id: str = "parent") -> Ledger:
    """One context, calls c0..c{n-1}, each continuing the one before."""
    ledger = Ledger(episode_id="run/s000001/t0/g0", group_id="g")
    _root(ledger, context_id)
    for i in range(n):
        call_id = f"{context_id}.c{i}"
        ledger.admit(call_id, context_id, extends=ledger.head(context_id))
        _complete(ledger, call_id, i)
    return ledger


def test_id_ranges_hold_canonical_ids_as_ranges_and_others_verbatim():
    ids = IdRanges()
    ids.add([f"p.0.c{i}" for i in (0, 1, 2, 3, 7, 8, 5)] + ["p.0.c3.r1", "p.0.c05"], "p.0")
    assert ids.spans == [(0, 3), (5, 5), (7, 8)] and ids.other == ["p.0.c3.r1", "p.0.c05"]
    assert ids.contains("p.0.c2", "p.0") and ids.contains("p.0.c8", "p.0") and ids.contains("p.0.c05", "p.0")
    assert not ids.contains("p.0.c4", "p.0") and not ids.contains("p.0.c9", "p.0")
    assert not ids.contains("p.0.c3.r2", "p.0") and not ids.contains("q.0.c2", "p.0")
    ids.add(["p.0.c4", "p.0.c6"], "p.0")
    assert ids.spans == [(0, 8)] and ids.size() == 11
    assert canonical_index("p.0.c12", "p.0") == 12 and canonical_index("p.0.c12", "p") is None


def test_a_settled_line_keeps_its_window_and_answers_like_the_whole_ledger():
    reference = _line(500)
    ledger = reference.model_copy(deep=True)
    assert ledger.settle(4) == 496
    assert list(ledger.calls) == [f"parent.c{i}" for i in range(496, 500)]
    assert ledger.summary() == reference.summary()  # counts include the settled calls
    assert ledger.state_of("parent.c7") == reference.calls["parent.c7"].state
    assert ledger.state_of("parent.c500") is None
    # one range of ids, not one entry per call
    assert ledger.settled["parent"].ids.spans == [(0, 495)] and not ledger.settled["parent"].ids.other
    # a duplicate of a settled id is refused without the id set
    with pytest.raises(DuplicateCallError, match="parent.c3"):
        ledger.validate_admit("parent.c3", "parent", extends="parent.c499")


def test_extending_branching_from_or_discarding_a_settled_call_is_refused_before_anything_changes():
    ledger = _line(40)
    ledger.settle(4)
    before = ledger.model_copy(deep=True)
    with pytest.raises(SettledCallError) as refused:
        ledger.admit("parent.c40", "parent", extends="parent.c10", branch=True)
    text = str(refused.value)
    for needed in ("run/s000001/t0/g0", "context 'parent'", "parent.c10", "branch_window=4", "parent.c39",
                   "EpisodeSpec.branch_window"):  # fmt: skip
        assert needed in text, (needed, text)
    assert refused.value.call_ids == ["parent.c10"] and refused.value.context_id == "parent"
    with pytest.raises(SettledCallError):
        ledger.discard("parent.c20", "not used")
    worker = ContextRecord(
        context_id="w.0", agent="w", origin=ContextOrigin.SPAWN, spawned_by_call="parent.c5"
    )
    with pytest.raises(SettledCallError):
        ledger.open_context(worker)
    assert ledger == before
    # the window itself is still open: a branch from its oldest call, a worker spawned by the head
    ledger.admit("parent.c40", "parent", extends="parent.c36", branch=True)
    ledger.open_context(worker.model_copy(update={"spawned_by_call": "parent.c39"}))


def test_a_discard_that_would_make_a_settled_call_the_head_is_refused_and_only_that():
    reference = _line(10)
    ledger = reference.model_copy(deep=True)
    ledger.settle(2)  # live: c8, c9
    for led in (ledger, reference):
        led.discard("parent.c9", "retried")  # head -> c8: in the window
    assert ledger.head("parent") == reference.head("parent") == "parent.c8"
    with pytest.raises(SettledCallError, match="would make a settled call"):
        ledger.discard("parent.c8", "retried")  # the head would be c7: settled
    reference.discard("parent.c8", "retried")
    assert reference.head("parent") == "parent.c7"


def test_a_retry_loop_past_the_window_still_retries_from_the_heads_parent():
    """The gateway's RETRY discards the head and extends the head's parent: after many retries the
    parent is older than the last `window` calls; it stays live as the head's ancestor."""
    reference = _line(5)
    for i in range(5, 13):
        head = reference.head("parent")
        parent = reference.calls[head].parent_call_id
        reference.discard(head, "retried")
        reference.admit(f"parent.c{i}", "parent", extends=parent)
        _complete(reference, f"parent.c{i}", i)
    ledger = reference.model_copy(deep=True)
    ledger.settle(2)
    assert "parent.c3" in ledger.calls and "parent.c2" not in ledger.calls
    for led in (ledger, reference):
        led.discard("parent.c12", "retried")
        led.admit("parent.c13", "parent", extends="parent.c3")
    assert ledger.summary() == reference.summary()


def test_a_repeated_discard_of_a_settled_discarded_call_is_a_no_op():
    ledger = _line(6)
    ledger.admit("parent.c6", "parent", extends="parent.c5")
    _complete(ledger, "parent.c6")
    ledger.discard("parent.c6", "retried")
    for i in range(7, 20):
        ledger.admit(f"parent.c{i}", "parent", extends=ledger.head("parent"))
        _complete(ledger, f"parent.c{i}", i)
    ledger.settle(3)
    assert ledger.state_of("parent.c6") == CallState.DISCARDED
    assert ledger.discard("parent.c6", "retried").state == CallState.DISCARDED
    assert ledger.summary().totals[CallState.DISCARDED] == 1


def _call_id(reference: Ledger, context_id: str) -> str:
    """The gateway's numbering: the context's number of calls so far (settled ones included)."""
    counts = next(c.counts for c in reference.summary().contexts if c.context_id == context_id)
    return f"{context_id}.c{sum(counts.values())}"


def _random_step(rng: random.Random, reference: Ledger) -> tuple[str, tuple]:
    contexts = [c for c, s in reference.contexts.items() if s.retired_by is None]
    ctx = rng.choice(contexts)
    calls = reference.contexts[ctx].call_ids
    pending = reference.pending()
    roll = rng.random()
    if roll < 0.35:
        return "admit", (_call_id(reference, ctx), ctx, reference.head(ctx), False)
    if roll < 0.45 and calls:
        return "admit", (_call_id(reference, ctx), ctx, rng.choice(calls), True)
    if roll < 0.7 and pending:
        return "complete", (rng.choice(pending),)
    if roll < 0.75 and pending:
        return "fail", (rng.choice(pending),)
    if roll < 0.9 and calls:
        return "discard", (rng.choice(calls[-8:] if rng.random() < 0.7 else calls),)
    if roll < 0.92 and reference.calls:
        agent = f"w{len(reference.contexts)}"
        spawner = rng.choice([c for c in reference.calls if reference.calls[c].agent != agent])
        record = ContextRecord(context_id=f"{agent}.0", agent=agent, origin=ContextOrigin.SPAWN,
                               spawned_by_call=spawner)  # fmt: skip
        return "open", (record,)
    if roll < 0.94:
        old = next(c for c in contexts if reference.contexts[c].record.agent == "parent")
        record = ContextRecord(context_id=f"parent.{len(reference.agents()['parent'])}", agent="parent",
                               origin=ContextOrigin.REWRITE, rewrite_of=old)  # fmt: skip
        return "open", (record,)
    return "settle", (rng.randint(2, 4),)


def _apply(ledger: Ledger, op: str, args: tuple, i: int) -> None:
    if op == "admit":
        call_id, ctx, extends, branch = args
        ledger.admit(call_id, ctx, extends=extends, branch=branch,
                     kind=CallKind.AUXILIARY if i % 11 == 0 else CallKind.ACTION)  # fmt: skip
    elif op == "complete":
        _complete(ledger, args[0], i)
    elif op == "fail":
        ledger.fail(args[0], "engine said no")
    elif op == "discard":
        ledger.discard(args[0], "not used")
    elif op == "open":
        ledger.open_context(args[0])


@pytest.mark.parametrize("seed", range(5))
def test_random_episodes_settled_at_random_points_answer_like_the_whole_ledger(seed: int):
    """Random admits, branches, completions, failures, discards, spawns and rewrites, applied to a ledger
    that settles at random points (after writing its changed pages, as the workflow's hand-over does)
    and to a reference that never settles: each step does the same to both, raises the same error, or
    is refused as settled by the settled ledger only. At the end the pages join to the reference, and
    the close's counts and last outputs agree."""
    rng = random.Random(seed)
    reference = Ledger(episode_id="e/1", group_id="g")
    _root(reference)
    ledger = reference.model_copy(deep=True)
    pages, saved_contexts, saved_calls = [], {}, {}
    refused = settles = 0
    for i in range(800):
        op, args = _random_step(rng, reference)
        if op == "settle":
            for call_id in reference.pending():  # the workflow settles after its calls in flight end
                for led in (ledger, reference):
                    _complete(led, call_id, i)
            pages += changed_pages(ledger, saved_contexts, saved_calls, 64)
            settles += ledger.settle(args[0]) > 0
            saved_contexts = {k: v.model_copy(deep=True) for k, v in ledger.contexts.items()}
            saved_calls = dict(ledger.calls)
            continue
        try:
            _apply(ledger, op, args, i)
        except SettledCallError:
            refused += 1
            continue
        except LedgerError as err:
            with pytest.raises(type(err)):
                _apply(reference, op, args, i)
            continue
        _apply(reference, op, args, i)
        if i % 7 == 0 or op == "discard":
            assert ledger.summary() == reference.summary(), (i, op, args)
    assert all(ledger.state_of(c) == r.state for c, r in reference.calls.items())
    assert settles >= 5 and refused >= 1 and len(ledger.calls) < len(reference.calls) / 2, (settles, refused)
    # what materialize joins: the pages written before each settle, then the last run's changes
    pages += changed_pages(ledger, saved_contexts, saved_calls, 64)
    joined = join_pages("e/1", "g", pages)
    assert joined.calls == reference.calls
    assert {k: (c.record, c.retired_by, c.call_ids) for k, c in joined.contexts.items()} == {
        k: (c.record, c.retired_by, c.call_ids) for k, c in reference.contexts.items()
    }
    reference.close(cancel_outstanding=True, reason="done")
    ledger.close(cancel_outstanding=True, reason="done")
    assert ledger.closed_counts() == {s: len(ids) for s, ids in reference.accounting().by_state.items()}
    assert ledger.last_outputs() == reference.last_outputs()
    assert ledger.root_agents() == reference.root_agents()
