"""Every ledger rule violation raises its own named error carrying episode, context, calls and the fix."""

from __future__ import annotations

import pytest

from grove.receipts import CallKind, ContextOrigin, ContextRecord
from ledger.ancestry import ancestry_evidence
from ledger.errors import (
    AmbiguousAncestryError,
    ClosingWithOutstandingCallsError,
    CrossContextContinuationError,
    DiscardInUseError,
    DuplicateCallError,
    DuplicateContextError,
    InvalidReservationError,
    InvalidTransitionError,
    LedgerClosedError,
    LedgerError,
    MissingAncestryEvidenceError,
    PendingPredecessorError,
    StaleContinuationError,
    UndeclaredDiscontinuityError,
    UnknownCallError,
    UnknownContextError,
    UnresolvedAcknowledgementError,
)
from tests.forest.kit import Episode, tokens


def started() -> Episode:
    """parent context p with p1 -> p2 completed; worker w spawned by p1 with w1 completed."""
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", tokens([1, 2], [3], [-1]))
    ep.call("p2", "p", tokens([1, 2, 3, 4], [5], [-2]), extends="p1")
    ep.spawn("w", "worker-1", by="p1")
    ep.call("w1", "w", tokens([7], [8], [-3]))
    return ep


def raises(cls: type[LedgerError], fn, *args, **kwargs) -> LedgerError:
    """Call fn, expect `cls`, and check the error carries the episode id and says what to do."""
    with pytest.raises(cls) as err:
        fn(*args, **kwargs)
    assert err.value.episode_id == "ep"
    assert "expected:" in str(err.value) and "to fix:" in str(err.value)
    return err.value


def test_stale_continuation_of_an_older_call():
    ep = started()
    err = raises(StaleContinuationError, ep.admit, "p3", "p", "p1")
    assert (err.context_id, err.call_ids) == ("p", ["p3", "p1"])
    assert "the head is 'p2'" in str(err)


def test_stale_continuation_of_a_discarded_call():
    ep = started()
    ep.ledger.discard("p2", "retry")
    err = raises(StaleContinuationError, ep.admit, "p3", "p", "p2")
    assert err.call_ids == ["p3", "p2"] and "discarded" in str(err)


def test_stale_continuation_into_a_retired_context():
    ep = started()
    ep.rewrite("p-2", "parent", of="p")
    err = raises(StaleContinuationError, ep.admit, "p3", "p", "p2")
    assert err.context_id == "p" and "retired by rewrite 'p-2'" in str(err)


def test_stale_rewrite_of_an_already_rewritten_context():
    ep = started()
    ep.rewrite("p-2", "parent", of="p")
    err = raises(StaleContinuationError, ep.rewrite, "p-3", "parent", of="p")
    assert err.context_id == "p-3" and "rewrite 'p-2' instead" in str(err)


def test_undeclared_discontinuity_when_a_later_call_extends_nothing():
    ep = started()
    err = raises(UndeclaredDiscontinuityError, ep.admit, "p3", "p")
    assert (err.context_id, err.call_ids) == ("p", ["p3"]) and "REWRITE" in str(err)


def test_undeclared_discontinuity_when_the_prompt_is_shorter_than_the_parent():
    ep = started()
    ep.admit("p3", "p", "p2")
    err = raises(UndeclaredDiscontinuityError, ep.complete, "p3", tokens([1, 2, 3, 4], [6], [-1]))
    assert err.call_ids == ["p3", "p2"] and "shorter than 'p2'" in str(err)
    assert ep.ledger.calls["p3"].state == "admitted"  # nothing changed: the workflow fails it instead


def test_unresolved_acknowledgement_at_close():
    ep = started()
    ep.admit("p3", "p", "p2")
    err = raises(UnresolvedAcknowledgementError, ep.close)
    assert (err.context_id, err.call_ids) == ("p", ["p3"])
    assert not ep.ledger.closed


def test_closing_while_worker_calls_are_outstanding():
    ep = started()
    ep.admit("w2", "w", "w1")
    err = raises(ClosingWithOutstandingCallsError, ep.close)
    assert (err.context_id, err.call_ids) == ("w", ["w2"]) and "cancel_outstanding=True" in str(err)
    assert not ep.ledger.closed and ep.ledger.calls["w2"].state == "admitted"


def test_duplicate_call_id():
    ep = started()
    err = raises(DuplicateCallError, ep.admit, "w1", "p", "p2")
    assert err.call_ids == ["w1"] and "context 'w'" in str(err)


def test_duplicate_context_id():
    ep = started()
    raises(DuplicateContextError, ep.spawn, "w", "worker-2", by="p1")


def test_unknown_context():
    ep = started()
    err = raises(UnknownContextError, ep.admit, "x1", "nowhere")
    assert err.context_id == "nowhere" and err.call_ids == ["x1"]


def test_unknown_call():
    ep = started()
    raises(UnknownCallError, ep.admit, "p3", "p", "nope")
    raises(UnknownCallError, ep.ledger.fail, "nope", "x")
    raises(UnknownCallError, ep.spawn, "v", "worker-2", by="nope")


def test_ambiguous_ancestry_when_two_candidates_match_the_same_prefix():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3], [-1]))
    ep.call("c2", "a", tokens([1, 2, 3, 4], [5], [-2]), extends="c1")
    ep.call("c2b", "a", tokens([1, 2, 3, 4], [5], [-2.5]), extends="c1", branch=True)  # same tokens
    evidence = ancestry_evidence([1, 2, 3, 4, 5, 6], ep.ledger.ancestry_ranges("a"))
    err = raises(AmbiguousAncestryError, ep.ledger.resolve_extends, "a", evidence)
    assert (err.context_id, err.call_ids) == ("a", ["c2", "c2b"]) and "first 5 tokens" in str(err)


def test_missing_ancestry_evidence():
    ep = started()
    evidence = ancestry_evidence([1, 2, 3, 4, 5, 6], [(0, 2)])  # lacks (2, 3), (0, 4), (4, 5)
    err = raises(MissingAncestryEvidenceError, ep.ledger.resolve_extends, "p", evidence)
    assert "(2, 3)" in str(err)


def test_cross_context_continuation():
    ep = started()
    err = raises(CrossContextContinuationError, ep.admit, "w2", "w", "p2")
    assert err.call_ids == ["w2", "p2"]


def test_pending_predecessor():
    ep = started()
    ep.admit("p3", "p", "p2")
    err = raises(PendingPredecessorError, ep.admit, "p4", "p", "p3")
    assert err.call_ids == ["p4", "p3"]


@pytest.mark.parametrize(
    "record",
    [
        ContextRecord(context_id="v", agent="parent", origin=ContextOrigin.ROOT),  # agent has a context
        ContextRecord(context_id="v", agent="x", origin=ContextOrigin.ROOT, spawned_by_call="p1"),
        ContextRecord(context_id="v", agent="x", origin=ContextOrigin.SPAWN),  # no spawning call
        ContextRecord(context_id="v", agent="parent", origin=ContextOrigin.SPAWN, spawned_by_call="p1"),
        ContextRecord(context_id="v", agent="x", origin=ContextOrigin.REWRITE),  # rewrites nothing
        ContextRecord(context_id="v", agent="worker-1", origin=ContextOrigin.REWRITE, rewrite_of="p"),
    ],
    ids=[
        "root-twice",
        "root-spawned",
        "spawn-no-call",
        "spawn-self",
        "rewrite-nothing",
        "rewrite-other-agent",
    ],
)
def test_invalid_context_reservations(record):
    ep = started()
    raises(InvalidReservationError, ep.ledger.open_context, record)


def test_a_worker_and_the_root_agent_may_be_spawned_again():
    """A worker invoked again with a fresh history (a second agent-as-tool call) is another SPAWN
    context of the same agent; both stay live. The root agent handed back to by a worker (an Agents SDK
    handoff back) is spawned again the same way: a SPAWN context beside its ROOT one."""
    ep = started()
    again = ContextRecord(
        context_id="w.1", agent="worker-1", origin=ContextOrigin.SPAWN, spawned_by_call="p2"
    )
    assert ep.ledger.open_context(again) == again
    live = {c.context_id: c.retired_by for c in ep.ledger.summary().contexts if c.agent == "worker-1"}
    assert live == {"w": None, "w.1": None}
    back = ContextRecord(context_id="p.1", agent="parent", origin=ContextOrigin.SPAWN, spawned_by_call="w1")
    assert ep.ledger.open_context(back) == back
    contexts = ep.ledger.summary().contexts
    roots = {c.context_id: (c.origin, c.spawned_by_call) for c in contexts if c.agent == "parent"}
    assert roots == {"p": (ContextOrigin.ROOT, None), "p.1": (ContextOrigin.SPAWN, "w1")}
    raises(InvalidReservationError, ep.spawn, "p.2", "parent", by="p2")  # still never by its own call


def test_spawn_from_a_discarded_call_is_invalid():
    ep = started()
    ep.call("p3", "p", tokens([1, 2, 3, 4, 5, 6], [7], [-1]), extends="p2")
    ep.ledger.discard("p3", "retry")
    raises(InvalidReservationError, ep.spawn, "v", "worker-2", by="p3")


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("fail", "complete"),
        ("cancel", "fail"),
        ("complete", "fail"),
        ("admitted", "discard"),
        ("complete", "abandon"),
    ],
)
def test_invalid_transitions(first, then):
    ep = started()
    ep.admit("p3", "p", "p2")
    arrays = tokens([1, 2, 3, 4, 5, 6], [7], [-1])
    steps = {
        "fail": lambda: ep.ledger.fail("p3", "boom"),
        "cancel": lambda: ep.ledger.cancel("p3", "stop"),
        "complete": lambda: ep.complete("p3", arrays),
        "discard": lambda: ep.ledger.discard("p3", "retry"),
        "abandon": lambda: ep.ledger.abandon("p3", "lost"),
        "admitted": lambda: None,
    }
    steps[first]()
    err = raises(InvalidTransitionError, steps[then])
    assert err.call_ids == ["p3"]


def test_completing_twice_with_a_different_receipt_is_invalid():
    ep = started()
    ep.admit("p3", "p", "p2")
    ep.complete("p3", tokens([1, 2, 3, 4, 5, 6], [7], [-1]))
    raises(InvalidTransitionError, ep.complete, "p3", tokens([1, 2, 3, 4, 5, 6], [8], [-1]))


def test_discarding_a_call_that_others_extend():
    ep = started()
    err = raises(DiscardInUseError, ep.ledger.discard, "p1", "retry")
    assert err.call_ids == ["p1", "p2"] and "spawned contexts ['w']" in str(err)


def test_changes_after_close_are_rejected():
    ep = started()
    ep.close()
    raises(LedgerClosedError, ep.admit, "p3", "p", "p2")
    raises(LedgerClosedError, ep.spawn, "v", "worker-2", by="p1")


def test_admitting_an_auxiliary_call_follows_the_same_rules():
    ep = started()
    raises(StaleContinuationError, ep.admit, "t1", "p", "p1", kind=CallKind.AUXILIARY)
