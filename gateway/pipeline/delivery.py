"""A captured call's delivery (`Delivery`: check, send, settle); the HTTP responses that drive it on the
connection are gateway/http/delivered_response.py.

What "delivered" means (docs/gateway.md, ledger/delivery.py): the ledger accepted the call's
`deliver` Update, which the route sends only after the response's last part (the JSON body, or the
stream's `data: [DONE]` event) went to a client connection that was still open. The ledger is the only
owner of that fact: a response whose last part never went out is never reported delivered, so nothing
has to be taken back, whatever order the client's departure, the route and a close come in. Before the
last part the route checks, as strictly as the transport allows (gateway/http/transport_probe.py):

- the ledger would still take the delivery (the `delivery_refusal` query): not after a close, not for a
  call another request discarded. Refused: the client gets the refusal instead of the response (a JSON
  error, or an error event ending the stream: the OpenAI clients raise it), and the call does not count;
- a stream: every earlier part has left the server and was acknowledged by the client's TCP (the kernel's
  send queue is empty), and the connection has not been closed by the client since;
- a JSON body (one part): the connection has not been closed by the client.

If the client has gone, nothing more is sent and the call is discarded at once (accounted, never
trained); a harness that re-sends the request gets a fresh call that extends what this one extended. A
close that comes first discards it instead (a call awaiting delivery at close). A close accepted between
the last part and its `deliver` makes the call not count although the client got it (the safe side).

What the server cannot know: whether the client's program read what its kernel acknowledged, and whether
the last part arrived when the connection dies right after it was sent. Such a response counts as
delivered; a harness that re-sends it anyway is recognised as a retry (gateway/pipeline/continuation.py) and
discards it then.

Disconnects are seen through uvicorn's request cycle and the ASGI `receive` channel: a streamed response
runs beside Starlette's disconnect listener, which cancels the stream when the client leaves. The
settling (the `deliver` or the discard Update) runs shielded from that cancellation, bounded by
`SETTLE_PATIENCE`, and always ends the request's registration (`CaptureState.release`): nothing of a
request outlives it, and its context is never left "being delivered".

Test gates (grove/gates.py): `delivery_check` holds a response before the ledger is asked whether it
still takes the delivery, `delivery_commit` holds it after that, just before its last-part checks (its
earlier parts sent and acknowledged), `delivery_settle` holds an undelivered call before its discard;
key `{episode id}/{call id}`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio

from capture.records import ChatRecord
from gateway.pipeline.capture_errors import CaptureError, DeliveryRefusedError
from gateway.pipeline.capture_state import CaptureState
from gateway.temporal.episode_client import EpisodeError

log = logging.getLogger("grove.gateway")
REFUSALS = (CaptureError, EpisodeError)  # what a refused or failed delivery raises
SETTLE_PATIENCE = 150.0  # seconds a settling Update may take (beyond the transient retries' 120 s)


@dataclass
class Delivery:
    """A captured call whose response is on its way: `commit` just before its last part is sent, `sent`
    once it went out, `settle` once, when the route is done with it."""

    capture: CaptureState
    record: ChatRecord
    requested: str  # the call id the request asked for (the record's may carry a lost-attempt suffix)
    # answered from an earlier launch's record (gateway/pipeline/launch_records.py): nothing to settle
    replayed: bool = False
    _settled: bool = field(default=False, repr=False)

    async def commit(self) -> None:
        """The response's last part is about to go to a connected client: DeliveryRefusedError when the
        ledger would refuse its delivery (a close came first, the call was discarded): the response must
        not be sent as delivered. Nothing is recorded yet (`settle` does, after the last part)."""
        episode_id, call_id = self.record.episode_id, self.record.call_id
        refusal = await self.capture.episodes.delivery_refusal(episode_id, call_id)
        if refusal:
            raise DeliveryRefusedError(
                f"episode {episode_id!r}: call {call_id!r} completed, but its delivery was refused "
                f"({refusal}); the response is not sent and is not trained. Start a new episode for a new "
                "attempt"
            )

    def sent(self) -> None:
        """The last part went out to an open connection: another request of the context may build on it
        before its `deliver` is recorded (gateway/pipeline/planning.py)."""
        self.capture.mark_sent(self.record.episode_id, self.requested)

    async def settle(self, delivered: bool) -> None:
        """Delivered: record it (`deliver`; a refusal now, a close first, only means it does not count).
        Not delivered: discard the call (never trained); a harness retry of it then extends what it
        extended. A replayed call belongs to the ledger already: only its delivery is recorded."""
        if self._settled:
            return
        self._settled = True
        episode_id, call_id = self.record.episode_id, self.record.call_id
        try:
            if delivered:
                await self._record_delivery(episode_id, call_id)
            elif not self.replayed:
                await self.capture.discard_quietly(
                    episode_id, call_id,
                    "response not delivered: the client went away before its last part was sent",
                )  # fmt: skip
        finally:
            self.capture.release(episode_id, self.requested)

    async def hold(self, point: str) -> None:
        """Wait at a test gate (grove/gates.py) keyed by this call; nothing outside tests."""
        if self.capture.gates is not None:
            await self.capture.gates.hold(point, f"{self.record.episode_id}/{self.record.call_id}")

    async def settle_shielded(self, delivered: bool) -> None:
        """`settle`, even when the response itself was cancelled (its client left), within
        SETTLE_PATIENCE."""
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + SETTLE_PATIENCE):
            if not delivered and not self.replayed:
                await self.hold("delivery_settle")
            await self.settle(delivered)

    async def _record_delivery(self, episode_id: str, call_id: str) -> None:
        try:
            await self.capture.episodes.deliver(episode_id, call_id)
        except EpisodeError as err:  # a close first: the ledger discards it at close; not trained
            log.warning("episode %r: call %r was sent but does not count: %s", episode_id, call_id, err)
