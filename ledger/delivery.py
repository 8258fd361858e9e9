"""Which responses reached their harness: delivery, decided in the ledger (pure).

A call the gateway makes for an external harness is admitted *awaiting delivery*
(`CallRequest.await_delivery`, `Ledger.awaiting_delivery`): the ledger completes it when its generation
ends, but its response still has to travel over HTTP, and only the gateway sees whether the client got it.
The gateway records the delivery with the workflow's `deliver` Update, accepted before the response's last
part is sent (gateway/pipeline/delivery.py says how strictly it checks the connection first). A call counts as
delivered, and may be trained, when:

- its `deliver` Update was accepted (the last part went out right after, to a connection still open);
- another call extends it, or a context names it as its spawner: the harness evidently had the response;
- it was made by the native in-workflow harness (no await flag): the program got the result itself.

Close freezes delivery: once a close is accepted, the workflow refuses `deliver` (and `discard`, `call`,
`open_context`), and every completed call still awaiting delivery is DISCARDED (`discard_undelivered`,
"delivery unknown at close"), never trained. So a close racing an abandoned response, a dropped stream or
a gateway that died mid-response never trains what nobody may have received, and a response that leaves
the gateway after the close does not count.

Awaiting calls are few (the responses on their way) and stay live across a long episode's hand-overs
(`Ledger.live_calls`), so the next run knows them.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from grove.receipts import CallState
from ledger.errors import LedgerError
from ledger.ledger import Ledger

# What an undelivered call's receipt says once the close discarded it (shown in the UI and the summary).
UNDELIVERED_AT_CLOSE = (
    "delivery unknown at close: the episode closed before the gateway recorded that the harness got this "
    "response whole (a client that gave up, a dropped stream, a gateway that stopped mid-response)"
)


class UndeliverableCallError(LedgerError):
    """A `deliver` for a call that has no response to deliver: still generating, discarded, failed or
    cancelled (a harness retry or a dropped client discarded it first)."""


def delivered_before(ledger: Ledger, call_id: str) -> bool:
    """The call counts as delivered already: its `deliver` was accepted (a repeat, perhaps asked again
    after a hand-over), or a call extends it, or a context names it as its spawner."""
    if call_id not in ledger.calls:
        return ledger.state_of(call_id) in (CallState.COMPLETED, CallState.SELECTED)  # settled, so delivered
    receipt = ledger.calls[call_id]
    live = (CallState.COMPLETED, CallState.SELECTED, CallState.AUXILIARY)
    return receipt.state in live and call_id not in ledger.awaiting_delivery


def validate_delivery(ledger: Ledger, call_id: str) -> None:
    """Raise what `record_delivery` would raise, without changing anything."""
    if call_id not in ledger.calls and ledger.state_of(call_id) == CallState.COMPLETED:
        return  # settled: a call awaiting delivery is never settled, so this one was delivered
    receipt = ledger.call(call_id)
    if receipt.state in (CallState.COMPLETED, CallState.SELECTED, CallState.AUXILIARY):
        return
    raise ledger._error(
        UndeliverableCallError,
        receipt.context_id,
        [call_id],
        f"call {call_id!r} is {receipt.state.value}: it has no response that may still be delivered",
        "a completed call (its generation ended, nothing discarded it)",
        "do not send the response: the call is not trained; a harness that re-sends its request gets a "
        "fresh call",
    )


def delivery_refusal(ledger: Ledger, call_id: str, *, closing: bool) -> str:
    """What a `deliver` of the call would be refused with now, as `ErrorType: message`; "" when it would
    be accepted (the gateway asks before it sends a response's last part)."""
    if delivered_before(ledger, call_id):
        return ""
    if closing:
        return f"Closing: the episode is closing; the response of {call_id} would not count"
    try:
        validate_delivery(ledger, call_id)
    except LedgerError as err:
        return f"{type(err).__name__}: {err}"
    return ""


def record_delivery(ledger: Ledger, call_id: str) -> bool:
    """The call's response reached its harness; True when that is news (it was awaiting delivery)."""
    validate_delivery(ledger, call_id)
    if call_id not in ledger.awaiting_delivery:
        return False  # delivered before (a repeated Update), used since, or never awaited (native)
    ledger.awaiting_delivery.remove(call_id)
    return True


def discard_undelivered(ledger: Ledger, reason: str = UNDELIVERED_AT_CLOSE) -> list[str]:
    """At close: every completed call still awaiting delivery becomes DISCARDED (never trained); returns
    their ids. Nothing follows a close, so no head rule applies: the close only takes what it cannot know
    was received out of training. Calls still generating are left to the close (which cancels them)."""
    discarded = []
    for call_id in list(ledger.awaiting_delivery):
        receipt = ledger.calls.get(call_id)
        if receipt is None or receipt.state != CallState.COMPLETED:
            continue
        ledger.calls[call_id] = receipt.model_copy(update={"state": CallState.DISCARDED, "note": reason})
        ledger.awaiting_delivery.remove(call_id)
        discarded.append(call_id)
    return discarded
