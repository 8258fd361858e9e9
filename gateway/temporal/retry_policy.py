"""Which answers of Temporal mean "ask again", and for how long the gateway asks.

Temporal's server (or the SDK's connection to it) answers some RPCs with a status that says nothing about
the request, only that it was not served now:

- CANCELLED: the server gave up on the call, e.g. a query dispatched to the sticky queue of a worker that
  was just killed (seen: 1 of 6 concurrent requests got 503 "the summary query: Temporal answered
  CANCELLED" under a worker SIGKILL);
- DEADLINE_EXCEEDED: no answer within the RPC's deadline (a busy server, no worker polling yet);
- UNAVAILABLE: the server or the connection is down for a moment (a restart);
- RESOURCE_EXHAUSTED: a limit that clears by itself, e.g. Temporal's 10 in-flight Updates per workflow
  (calls generating hold theirs until they end).

Every query, read and Update the gateway makes (gateway/temporal/episode_client.py) is asked again on these,
with backoff (50 ms doubling to 1 s), for up to `TRANSIENT_PATIENCE` seconds; then the request gets 503
`TemporalUnavailableError` naming the last status. Asking again is safe: queries change nothing, and an Update
carries an id fixed for its request (Temporal answers a repeated id from the same Update). Other statuses
(NOT_FOUND, INVALID_ARGUMENT, ...) answer the request and are never retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")

TRANSIENT_STATUSES = frozenset(
    {
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)
TRANSIENT_PATIENCE = 120.0  # seconds: a worker restart, a sticky queue's timeout, a server restart
FIRST_DELAY = 0.05
MAX_DELAY = 1.0


def is_transient(err: BaseException) -> bool:
    return isinstance(err, RPCError) and err.status in TRANSIENT_STATUSES


async def transient_retries(
    call: Callable[[], Awaitable[T]],
    *,
    patience: float = TRANSIENT_PATIENCE,
    on_retry: Callable[[RPCError], None] | None = None,
    stop_if: Callable[[], Awaitable[bool]] | None = None,
) -> T:
    """`call()`, asked again while it fails with a transient status (module docstring) and `patience`
    seconds have not passed; the last transient error is raised after them, anything else at once.
    `stop_if()` true after a transient answer raises it at once (a query whose workflow has no worker
    polling: gateway/temporal/worker_wait.py waits for one instead)."""
    deadline = time.monotonic() + patience
    delay = FIRST_DELAY
    while True:
        try:
            return await call()
        except RPCError as err:
            if not is_transient(err) or time.monotonic() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(err)
            if stop_if is not None and await stop_if():
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
