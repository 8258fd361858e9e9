"""A captured call's delivery (`Delivery`: commit, then settle) and the HTTP responses that record it in
the ledger, settling the call accordingly.

What "delivered" means (docs/gateway.md, workflows/delivery.py): the response's last part (the JSON
body, or the stream's `data: [DONE]` event) goes to a client connection that is still open, and the
ledger accepted the call's `deliver` Update just before it. Before that Update the route checks, as
strictly as the transport allows (gateway/transport_probe.py):

- a stream: every earlier part has left the server and was acknowledged by the client's TCP (the kernel's
  send queue is empty), and the connection has not been closed by the client since;
- a JSON body (one part): the connection has not been closed by the client while the call generated.

If the client has gone, nothing more is sent and the call is discarded at once (accounted, never
trained); a harness that re-sends the request gets a fresh call that extends what this one extended. If
the ledger refuses the delivery (the episode was closed first: a close freezes delivery), the client gets
the refusal instead of the response (a JSON error, or an error event ending the stream: the OpenAI
clients raise it), and the call does not count.

What the server cannot know: whether the client's program read what its kernel acknowledged, and whether
the last part, sent right after the Update, arrived before the connection died. Such a response counts as
delivered; a harness that re-sends it anyway is recognised as a retry (gateway/continuation.py) and
discards it then.

Disconnects are seen through uvicorn's request cycle and the ASGI `receive` channel: a streamed response
runs beside Starlette's disconnect listener (which cancels the stream when the client leaves).

Test gates (grove/gates.py): `delivery_commit` holds a response just before its last-part checks (its
earlier parts sent and acknowledged), `delivery_settle` holds an undelivered call before its discard;
key `{episode id}/{call id}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from capture.records import ChatRecord
from gateway.capture_errors import CaptureError, DeliveryRefusedError
from gateway.capture_state import CaptureState
from gateway.episodes import EpisodeError, EpisodeUpdateRejectedError
from gateway.routes.errors import error_response
from gateway.transport_probe import Connection

REFUSALS = (CaptureError, EpisodeError)  # what a refused or failed delivery raises


@dataclass
class Delivery:
    """A captured call whose response is on its way: `commit` just before its last part is sent,
    `settle` once, when the route is done with it."""

    capture: CaptureState
    record: ChatRecord
    requested: str  # the call id the request asked for (the record's may carry a lost-attempt suffix)
    replayed: bool = False  # answered from an earlier launch's record (gateway/replay.py): nothing to settle
    _settled: bool = field(default=False, repr=False)

    async def commit(self) -> None:
        """The response's last part is about to go to a connected client: record the delivery in the
        ledger (a replayed call's too: its first launch may never have got it). DeliveryRefusedError when
        the ledger refuses it (a close came first): the response must not be sent as delivered."""
        episode_id, call_id = self.record.episode_id, self.record.call_id
        try:
            await self.capture.episodes.deliver(episode_id, call_id)
        except EpisodeUpdateRejectedError as err:
            raise DeliveryRefusedError(
                f"episode {episode_id!r}: call {call_id!r} completed, but its delivery was refused "
                f"({err.error_type}: {err}); the response is not sent and is not trained. Start a new "
                "episode for a new attempt"
            ) from None

    async def settle(self, delivered: bool) -> None:
        """Delivered: nothing more to do. Not delivered: discard the call (never trained as an action);
        a harness retry of it then extends what it extended."""
        if self._settled:
            return
        self._settled = True
        if self.replayed:  # the call belongs to the ledger already; a relaunch that died replays it again
            return
        try:
            if not delivered:
                await self.capture.discard_quietly(
                    self.record.episode_id,
                    self.record.call_id,
                    "response not delivered: the client went away before its last part was sent",
                )
        finally:
            self.capture.release(self.record.episode_id, self.requested)


async def _client_left(connection: Connection, scope: Scope, receive: Receive) -> bool:
    return connection.closed() or await Request(scope, receive).is_disconnected()


async def _hold(delivery: Delivery, point: str) -> None:
    gates = delivery.capture.gates
    if gates is not None:  # tests only
        await gates.hold(point, f"{delivery.record.episode_id}/{delivery.record.call_id}")


async def _settle(delivery: Delivery, delivered: bool) -> None:
    with anyio.CancelScope(shield=True):  # settle even when the response itself was cancelled
        if not delivered and not delivery.replayed:
            await _hold(delivery, "delivery_settle")
        await delivery.settle(delivered)


class DeliveredJSONResponse(JSONResponse):
    """A `chat.completion` body whose delivery is recorded before it is sent."""

    def __init__(self, content: Any, delivery: Delivery, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self.delivery = delivery

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False
        connection = Connection.of(receive)
        try:
            await _hold(self.delivery, "delivery_commit")
            if await _client_left(connection, scope, receive):
                return  # the client gave up while the call generated: nothing to send it
            try:
                await self.delivery.commit()
            except REFUSALS as err:
                await error_response(err)(scope, receive, send)
                return
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            await send({"type": "http.response.body", "body": self.body})
            delivered = True
        finally:
            await _settle(self.delivery, delivered)
        if self.background is not None:
            await self.background()


class DeliveredStreamingResponse(StreamingResponse):
    """Server-sent events of a finished call; its delivery is recorded before the last event, once every
    earlier one was acknowledged by the client."""

    def __init__(
        self,
        events: Iterable[str],
        delivery: Delivery,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.events = [e.encode() for e in events]
        self.delivery = delivery
        self.delivered = False
        self._scope: Scope = {}
        self._receive: Receive | None = None
        super().__init__(iter(()), media_type="text/event-stream", headers=headers)

    async def _body(self, send: Send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def stream_response(self, send: Send) -> None:
        assert self._receive is not None
        connection = Connection.of(self._receive)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        *earlier, last = self.events
        for event in earlier:
            await self._body(send, event)
        if not await connection.drained():
            return  # the client left, or stopped reading: the last event is not sent
        await _hold(self.delivery, "delivery_commit")
        if await _client_left(connection, self._scope, self._receive):
            return
        try:
            await self.delivery.commit()
        except REFUSALS as err:
            await self._body(send, _error_event(err))
        else:
            await self._body(send, last)
            self.delivered = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope, self._receive = scope, receive
        try:
            await super().__call__(scope, receive, send)  # cancelled by the listener if the client leaves
        finally:
            await _settle(self.delivery, self.delivered)


def _error_event(err: Exception) -> bytes:
    """The refusal as a server-sent event the OpenAI clients raise (`{"error": {...}}`)."""
    return b"data: " + bytes(error_response(err).body) + b"\n\n"
