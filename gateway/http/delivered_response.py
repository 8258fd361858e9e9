"""The HTTP responses of a captured call that record its delivery: a JSON body or server-sent events in
any wire format (gateway/http/wire/adapter.py renders them), each sent only as far as the client is still
there, then settled in the ledger through the call's `Delivery` (gateway/pipeline/delivery.py says what
"delivered" means and in which order the checks run). A refused delivery is answered in the wire
format's error shape instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.http.routes.errors import refusal_of
from gateway.http.transport_probe import Connection
from gateway.http.wire.refusal import ErrorShape
from gateway.pipeline.delivery import REFUSALS, Delivery


async def _client_left(connection: Connection, scope: Scope, receive: Receive) -> bool:
    return connection.closed() or await Request(scope, receive).is_disconnected()


class DeliveredJSONResponse(JSONResponse):
    """A call's JSON body whose delivery is recorded once it was sent."""

    def __init__(
        self,
        content: Any,
        delivery: Delivery,
        *,
        errors: ErrorShape,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, headers=headers)
        self.delivery = delivery
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False
        connection = Connection.of(receive)
        try:
            await self.delivery.hold("delivery_check")
            try:
                await self.delivery.commit()
            except REFUSALS as err:
                await self.errors.response(refusal_of(err))(scope, receive, send)
                return
            await self.delivery.hold("delivery_commit")
            if await _client_left(connection, scope, receive):
                return  # the client gave up: nothing to send it
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            await send({"type": "http.response.body", "body": self.body})
            delivered = not connection.closed()  # a send to a closed connection is dropped silently
            if delivered:
                self.delivery.sent()
        finally:
            await self.delivery.settle_shielded(delivered)
        if self.background is not None:
            await self.background()


class DeliveredStreamingResponse(StreamingResponse):
    """Server-sent events of a finished call; its last event goes once every earlier one was acknowledged
    by the client and the ledger would take its delivery, which is recorded after it."""

    def __init__(
        self,
        events: Iterable[str],
        delivery: Delivery,
        *,
        errors: ErrorShape,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.events = [e.encode() for e in events]
        self.delivery = delivery
        self.errors = errors
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
        await self.delivery.hold("delivery_check")
        try:
            await self.delivery.commit()
        except REFUSALS as err:
            await self._body(send, self.errors.event(refusal_of(err)))
        else:
            await self.delivery.hold("delivery_commit")
            if await _client_left(connection, self._scope, self._receive):
                return
            await self._body(send, last)
            if connection.closed():
                return  # dropped silently: the client was gone
            self.delivered = True
            self.delivery.sent()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope, self._receive = scope, receive
        try:
            await super().__call__(scope, receive, send)  # cancelled by the listener if the client leaves
        finally:
            await self.delivery.settle_shielded(self.delivered)
