"""What the server can know, while it sends a response, about the connection it sends it on.

Measured on uvicorn (httptools and h11 alike, ASGI spec 2.3) and Linux sockets:

- `send()` of a body part returns once the bytes are handed to the asyncio transport; the transport
  writes what the kernel takes at once and buffers the rest. `send()` waits (uvicorn's flow control) only
  while that buffer is over its high-water mark (64 KiB), so a response of a few KB is "sent" long
  before any of it has left the machine.
- The kernel then holds the bytes in the socket's send queue until the peer's TCP acknowledges them
  (`SIOCOUTQ`, Linux: bytes sent but not yet acknowledged, plus bytes not yet sent). An acknowledgement
  means the bytes are in the *client's kernel*, not that its program read them.
- A client that closes its connection becomes visible when its FIN (or its RST: a close with unread
  data) reaches the server's event loop: uvicorn then marks the request `disconnected`, answers
  `http.disconnect` on `receive()`, and drops every later `send()` without an error.

So the strictest evidence the server can have that a client got a response is: every earlier part left
the transport and was acknowledged by the client's TCP, and the connection is still open when the last
part goes out. What it can never know is whether the client's *program* read the bytes its kernel
acknowledged (a client that reads one chunk of a stream and then closes, after the last part was sent,
got all of it as far as any server can tell), and whether the last part itself reached the client when
the connection dies right after it was sent.

`Connection` reads these from uvicorn's request cycle (the object behind the ASGI `receive` callable).
Under another server it knows only what ASGI says (`http.disconnect`); `drained` then returns at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive

SIOCOUTQ = termios.TIOCOUTQ  # Linux: for a TCP socket, bytes not yet acknowledged by the peer
DRAIN_PATIENCE = 30.0  # seconds a client may take to acknowledge what it was sent before the last part
FIRST_POLL, MAX_POLL = 0.001, 0.02  # acknowledgements have no event: polled, 1 ms doubling to 20 ms


@dataclass(frozen=True)
class Connection:
    """The transport behind one request (None: not served by uvicorn; ASGI's view only)."""

    cycle: Any

    @classmethod
    def of(cls, receive: Receive) -> Connection:
        cycle = getattr(receive, "__self__", None)  # uvicorn's RequestResponseCycle.receive is a method
        known = cycle is not None and hasattr(cycle, "transport") and hasattr(cycle, "disconnected")
        return cls(cycle if known else None)

    def closed(self) -> bool:
        """The client has gone, as far as the event loop has seen (FIN or RST processed)."""
        if self.cycle is None:
            return False
        return bool(self.cycle.disconnected) or self.cycle.transport.is_closing()

    def unacknowledged(self) -> int:
        """Bytes of this connection the client's TCP has not acknowledged yet: the transport's buffer
        plus the kernel's send queue (0 where the kernel cannot say)."""
        if self.cycle is None:
            return 0
        transport = self.cycle.transport
        pending = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if sock is None:
            return pending
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            queued = 0
        return pending + queued

    async def drained(self, patience: float = DRAIN_PATIENCE) -> bool:
        """Wait until everything sent so far was acknowledged by the client: True; False when the client
        went away first, or did not acknowledge within `patience` (it is not reading)."""
        deadline = time.monotonic() + patience
        delay = FIRST_POLL
        while not self.closed():
            if self.unacknowledged() == 0:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_POLL)
        return False
