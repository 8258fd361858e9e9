"""A client that sends its request head too slowly loses its connection (uvicorn has no such timeout).

uvicorn (httptools) waits for ever for a request line and headers that trickle in, and nothing in the
app can see such a connection (a route runs only once the head is complete), while each holds a file
descriptor and a parser. So the gateway serves HTTP with a protocol that closes a connection whose
request head is not complete within `RequestLimits.header_timeout_s` (10 s) of the connection, or of the
first byte of a later request on a kept-alive one (idle kept-alive connections are uvicorn's: closed
after `timeout_keep_alive`, 5 s). Bodies have their own bound: a minimum upload rate (gateway/intake/limits.py
`read_body`).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeadTimeoutProtocol(HttpToolsProtocol):
    """httptools' protocol, with a deadline on every request head (module docstring)."""

    head_timeout_s = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.write(HEAD_TIMEOUT)
            self.transport.close()


def head_timeout_protocol(seconds: float) -> type[HeadTimeoutProtocol]:
    """The protocol class uvicorn is given (`http=`), with this deadline."""
    return type("GatewayHttpProtocol", (HeadTimeoutProtocol,), {"head_timeout_s": seconds})
