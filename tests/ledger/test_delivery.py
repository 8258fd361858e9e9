"""Delivery decided in the ledger (ledger/delivery.py): a response awaiting delivery is trained only once
it was delivered or used; the close discards the rest; the rows own exactly the selected calls.

A real Ledger driven as the workflow drives it (tests/forest/kit.py), the rows built by the real
reconstruction from the ledger's closed receipts.
"""

from __future__ import annotations

import pytest

from grove.receipts import CallState
from ledger.delivery import (
    UNDELIVERED_AT_CLOSE,
    UndeliverableCallError,
    delivered_before,
    delivery_refusal,
    discard_undelivered,
    record_delivery,
    validate_delivery,
)
from ledger.handover import apply_page, split_pages
from ledger.ledger import Ledger
from tests.forest.kit import Episode, tokens

A = tokens([1, 2], [3], [-0.5])
B = tokens([1, 2, 3, 4], [5], [-0.25])
C = tokens([7, 8], [9], [-0.75])


def gateway_call(ep: Episode, call_id: str, context_id: str, arrays, extends: str | None = None) -> None:
    """A call as the gateway makes it: admitted awaiting delivery, then completed."""
    ep.ledger.admit(call_id, context_id, extends=extends, awaits_delivery=True)
    ep.complete(call_id, arrays)


def owned(ep: Episode) -> set[str]:
    """The calls whose loss the reconstructed rows carry (one owning row per trained call)."""
    return {s.call_id for row in ep.reconstruct().rows for s in row.spans if s.owned}


def states(ep: Episode) -> dict[str, CallState]:
    return {c: r.state for c, r in ep.ledger.calls.items()}


def test_a_response_never_delivered_is_discarded_at_close_and_trained_in_no_row():
    ep = Episode()
    ep.root("p.0", "p")
    gateway_call(ep, "p.0.c0", "p.0", A)
    record_delivery(ep.ledger, "p.0.c0")
    gateway_call(ep, "p.0.c1", "p.0", B, extends="p.0.c0")  # completed; the client gave up before it
    assert discard_undelivered(ep.ledger) == ["p.0.c1"]
    accounting = ep.close()
    assert states(ep) == {"p.0.c0": CallState.SELECTED, "p.0.c1": CallState.DISCARDED}
    assert ep.ledger.calls["p.0.c1"].note == UNDELIVERED_AT_CLOSE
    assert accounting.by_state[CallState.SELECTED] == ["p.0.c0"]
    assert owned(ep) == {"p.0.c0"}  # the rows own exactly the selected calls


def test_a_response_that_is_extended_or_spawned_a_worker_was_used_and_is_trained():
    ep = Episode()
    ep.root("p.0", "p")
    gateway_call(ep, "p.0.c0", "p.0", A)  # never recorded delivered, but the harness continued it
    gateway_call(ep, "p.0.c1", "p.0", B, extends="p.0.c0")
    ep.spawn("w.0", "w", by="p.0.c1")  # never recorded delivered, but it started a worker
    gateway_call(ep, "w.0.c0", "w.0", C)
    record_delivery(ep.ledger, "w.0.c0")
    assert ep.ledger.awaiting_delivery == []
    assert discard_undelivered(ep.ledger) == []
    ep.close()
    assert set(states(ep).values()) == {CallState.SELECTED}
    assert owned(ep) == {"p.0.c0", "p.0.c1", "w.0.c0"}


def test_calls_of_the_native_harness_are_delivered_on_completion():
    ep = Episode()
    ep.root("p.0", "p")
    ep.call("p.0.c0", "p.0", A)  # admitted without awaiting delivery
    assert discard_undelivered(ep.ledger) == []
    ep.close()
    assert states(ep) == {"p.0.c0": CallState.SELECTED}


def test_only_a_completed_call_can_be_delivered_and_a_repeat_changes_nothing():
    ep = Episode()
    ep.root("p.0", "p")
    ep.ledger.admit("p.0.c0", "p.0", awaits_delivery=True)
    with pytest.raises(UndeliverableCallError, match="admitted"):
        validate_delivery(ep.ledger, "p.0.c0")  # still generating
    ep.complete("p.0.c0", A)
    assert record_delivery(ep.ledger, "p.0.c0") is True
    assert record_delivery(ep.ledger, "p.0.c0") is False  # a repeated Update
    gateway_call(ep, "p.0.c1", "p.0", B, extends="p.0.c0")
    ep.ledger.discard("p.0.c1", "the client left")
    assert ep.ledger.awaiting_delivery == []  # a dead call awaits nothing
    with pytest.raises(UndeliverableCallError, match="discarded"):
        record_delivery(ep.ledger, "p.0.c1")


def test_a_lost_attempt_awaits_nothing_and_its_retry_awaits_delivery():
    ep = Episode()
    ep.root("p.0", "p")
    ep.ledger.admit("p.0.c0", "p.0", awaits_delivery=True)
    ep.ledger.abandon("p.0.c0", "lost attempt")
    ep.ledger.admit("p.0.c0.r1", "p.0", awaits_delivery=True)
    assert ep.ledger.awaiting_delivery == ["p.0.c0.r1"]


def test_calls_awaiting_delivery_stay_live_across_a_settle_and_a_paged_hand_over():
    """A long episode settles calls older than its window; a response on its way must survive the
    hand-over (its delivery comes to the next run) and is never settled."""
    ep = Episode()
    ep.root("p.0", "p")
    gateway_call(ep, "p.0.c0", "p.0", A)
    record_delivery(ep.ledger, "p.0.c0")
    ep.ledger.admit("p.0.c1", "p.0", extends="p.0.c0", branch=True, awaits_delivery=True)
    ep.complete("p.0.c1", B)  # on its way to the client
    for i in range(2, 8):  # branches delivered after it push it out of a window of 2
        ep.ledger.admit(f"p.0.c{i}", "p.0", extends="p.0.c0", branch=True, awaits_delivery=True)
        ep.complete(f"p.0.c{i}", tokens([1, 2, 3, 10 + i], [4], [-0.1]))
        record_delivery(ep.ledger, f"p.0.c{i}")
    assert "p.0.c1" in ep.ledger.live_calls(2)
    ep.ledger.settle(2)
    assert "p.0.c1" in ep.ledger.calls and ep.ledger.awaiting_delivery == ["p.0.c1"]
    # the carry of a paged hand-over: the ledger without its calls, plus its live pages
    empty = ep.ledger.model_copy(update={"contexts": {}, "calls": {}})
    carried = Ledger.model_validate_json(empty.model_dump_json())
    for page in split_pages(ep.ledger, 3):
        apply_page(carried, page)
    assert carried.awaiting_delivery == ["p.0.c1"]
    record_delivery(carried, "p.0.c1")  # the next run takes the delivery
    assert discard_undelivered(carried) == []


def test_the_refusal_the_gateway_asks_for_before_a_last_part_matches_what_deliver_does():
    """`delivery_refusal` (asked before the last part) says what `deliver` would answer: a delivery the
    ledger counted already is taken again after a close too (a `deliver` asked again after a hand-over
    gets the same answer); an undelivered call after a close, or a discarded one, is refused."""
    ep = Episode()
    ep.root("p.0", "p")
    gateway_call(ep, "p.0.c0", "p.0", A)
    assert delivery_refusal(ep.ledger, "p.0.c0", closing=False) == ""
    assert delivery_refusal(ep.ledger, "p.0.c0", closing=True).startswith("Closing: ")
    assert not delivered_before(ep.ledger, "p.0.c0")
    assert record_delivery(ep.ledger, "p.0.c0") is True
    assert delivered_before(ep.ledger, "p.0.c0")
    assert delivery_refusal(ep.ledger, "p.0.c0", closing=True) == ""  # counted already: the same answer
    assert record_delivery(ep.ledger, "p.0.c0") is False  # a repeat changes nothing
    gateway_call(ep, "p.0.c1", "p.0", B, extends="p.0.c0")
    ep.ledger.discard("p.0.c1", "the client left before its last part")
    refusal = delivery_refusal(ep.ledger, "p.0.c1", closing=False)
    assert refusal.startswith("UndeliverableCallError: ") and "discarded" in refusal
    with pytest.raises(UndeliverableCallError):
        validate_delivery(ep.ledger, "p.0.c1")
