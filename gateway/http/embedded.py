"""A capture gateway served inside another process (the harness worker's), on a loopback port.

    async with serve_gateway(settings, store) as url:   # url = "http://127.0.0.1:<port>"
        ...

`grove worker --queues harness` without `--gateway-url` serves one this way, so a single worker process
can run OpenCode episodes end to end. The port is picked by the OS; the URL is what harnesses get.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn

from gateway.http.app import create_app
from gateway.http.settings import GatewaySettings
from gateway.http.slow_clients import head_timeout_protocol
from storage.base import ObjectStore

STARTUP_POLLS = 600  # x 50 ms: the lifespan loads the policy model's tokenizer


class GatewayStartError(RuntimeError):
    """The embedded gateway did not start (its lifespan failed: Temporal, store, tokenizer)."""


@asynccontextmanager
async def serve_gateway(settings: GatewaySettings, store: ObjectStore | None = None) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind((settings.host, settings.port))
    protocol = head_timeout_protocol(settings.limits.header_timeout_s)  # gateway/http/slow_clients.py
    config = uvicorn.Config(create_app(settings, store), log_level="warning", lifespan="on", http=protocol)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(STARTUP_POLLS):  # started is a state that stays once reached
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)
    if task.done() or not server.started:
        server.should_exit = True
        exc = task.exception() if task.done() else None
        sock.close()
        raise GatewayStartError(f"the embedded gateway did not start: {exc!r}")
    try:
        yield f"http://{settings.host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
