"""HTTP responses that know whether they were delivered, and settle the call accordingly.

What "delivered" means (docs/gateway.md): the response's last part (the JSON body, or the stream's
`data: [DONE]` event) was handed to a client connection that was still open, after the call's delivery
mark was written (gateway/records.py). A response is *undelivered* when the client left before that
(a dropped stream, a client that timed out while the call generated), or when the mark could not be
written; an undelivered call is discarded: accounted, never trained as an accepted action. A harness that
re-sends the request then gets a fresh call that extends what the undelivered one extended.

The server cannot know more than that: bytes handed to an open connection may still be lost if the client
dies right after; such a response is marked delivered, and a harness retry of it is recognised as a retry
(gateway/continuation.py), which discards it then.

Disconnects are seen through the ASGI `receive` channel: a streamed response runs beside Starlette's
disconnect listener (which cancels the stream when the client leaves), and before the last part both
kinds probe the channel without waiting (Starlette's `Request.is_disconnected`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.capture import Delivery


async def _commit(delivery: Delivery, scope: Scope, receive: Receive) -> bool:
    """Just before the last part: False if the client has already left; else mark the call delivered."""
    if await Request(scope, receive).is_disconnected():
        return False
    await delivery.commit()
    return True


async def _settle(delivery: Delivery, delivered: bool) -> None:
    with anyio.CancelScope(shield=True):  # settle even when the response itself was cancelled
        await delivery.settle(delivered)


class DeliveredJSONResponse(JSONResponse):
    """A `chat.completion` body whose delivery settles its call."""

    def __init__(self, content: Any, delivery: Delivery, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self.delivery = delivery

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = False
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            if await _commit(self.delivery, scope, receive):
                await send({"type": "http.response.body", "body": self.body})
                delivered = True
        finally:
            await _settle(self.delivery, delivered)
        if self.background is not None:
            await self.background()


class DeliveredStreamingResponse(StreamingResponse):
    """Server-sent events of a finished call whose delivery settles it."""

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

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        assert self._receive is not None
        for i, event in enumerate(self.events):
            if i == len(self.events) - 1 and not await _commit(self.delivery, self._scope, self._receive):
                return
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.delivered = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope, self._receive = scope, receive
        try:
            await super().__call__(scope, receive, send)  # cancelled by the listener if the client leaves
        finally:
            await _settle(self.delivery, self.delivered)
