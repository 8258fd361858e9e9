"""Capture exactness on real services (Temporal dev server, a grove worker with the real vLLM engine on the
tiny model, uvicorn): retried rewrite requests, requests racing a response's delivery, streams dropped
mid-way by a real client connection (tests/gateway/test_delivery_races_e2e.py: the same against a close).

Moments in time are made by gates the test holds, never waited for: `GatedStore` holds the gateway's
chat-record write (the window between the ledger completing a call and its response leaving), and
`SendGate` holds a response after its first streamed part until the client has gone. What the episode
admitted and settled is read from the workflow (summary query, close result), never from the gateway.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

from gateway.http.app import create_app
from gateway.http.auth import issue_token
from gateway.http.settings import GatewaySettings
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import (
    MODEL,
    SECRET,
    SYSTEM,
    base_url,
    body,
    close,
    contexts,
    extension_of,
    oai,
    sse_chunks,
    start_episode,
    summary,
    until_serving,
)

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


# ---------------------------------------------------------------------------------------------- gates


class GatedStore(LocalStore):
    """The real local store; when armed, the next chat-record write waits until the test releases it."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.armed = False
        self.reached = threading.Event()  # a chat-record write is being held
        self.release = threading.Event()

    def arm(self) -> None:
        self.armed, self.reached, self.release = True, threading.Event(), threading.Event()

    def put_if_absent(self, key, data):
        if self.armed and key.endswith(".chat.json"):
            self.armed = False
            self.reached.set()
            self.release.wait(timeout=240)
        return super().put_if_absent(key, data)


@dataclass
class Held:
    held: asyncio.Event = field(default_factory=asyncio.Event)  # a send is being held
    release: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # the app returned (call settled)


class SendGate:
    """ASGI middleware: when armed, holds the next chat response before its second body part until the
    test releases it (the client may leave meanwhile), and says when the app has returned."""

    def __init__(self, app) -> None:
        self.app = app
        self.armed: Held | None = None

    def arm(self) -> Held:
        self.armed = Held()
        return self.armed

    async def __call__(self, scope, receive, send):
        gate = None
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            gate, self.armed = self.armed, None
        if gate is None:
            return await self.app(scope, receive, send)
        parts = 0

        async def held_send(message):
            nonlocal parts
            if message["type"] == "http.response.body":
                parts += 1
                if parts == 2:
                    gate.held.set()
                    await gate.release.wait()
            await send(message)

        try:
            await self.app(scope, receive, held_send)
        finally:
            gate.finished.set()


@dataclass
class Gateway:
    url: str
    store: GatedStore
    sends: SendGate


@pytest.fixture(scope="module")
async def gated_gateway(temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine):
    settings = GatewaySettings(
        temporal_address=temporal_server.address, store=str(e2e_store.root), secret=SECRET, model_name=MODEL,
        policy_model=str(tiny_model_dir), max_model_len=recording_engine.config.max_model_len,
    )  # fmt: skip
    app = create_app(settings)
    sends = SendGate(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(sends, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await until_serving(server, task)
    store = GatedStore(e2e_store.root)
    app.state.capture.store = store  # the same objects, written through the gate
    yield Gateway(f"http://127.0.0.1:{sock.getsockname()[1]}", store, sends)
    server.should_exit = True
    await task
    sock.close()


def http(url: str, episode_id: str, **kw) -> httpx.AsyncClient:
    token = issue_token(SECRET, episode_id)
    return httpx.AsyncClient(
        base_url=base_url(url, episode_id), headers={"authorization": f"Bearer {token}"}, timeout=120, **kw
    )


def counts(s, context_id: str) -> dict:
    return {k.value: v for k, v in contexts(s)[context_id].counts.items() if v}


# ---------------------------------------------------------------------------------------------- tests


async def test_a_resent_rewrite_request_discards_its_first_response(gated_gateway, temporal_client):
    """The OpenAI client re-sends a timed-out request with its headers: the second `x-grove-rewrite: 1`
    send must not open a second rewrite and leave the first response selected."""
    url = gated_gateway.url
    eid = await start_episode(temporal_client, "rewrite-retry")
    client = oai(url, eid)
    await client.chat.completions.create(model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Go."}])
    rewrite = oai(url, eid, **{"x-grove-rewrite": "1"})
    rewritten = [SYSTEM, {"role": "user", "content": "Summary: we went. Continue."}]
    first = await rewrite.chat.completions.with_raw_response.create(model=MODEL, messages=rewritten)
    again = await rewrite.chat.completions.with_raw_response.create(model=MODEL, messages=rewritten)
    assert first.headers["x-grove-call-id"] == "parent.1.c0"
    assert again.headers["x-grove-call-id"] == "parent.1.c1"  # the rewrite context's root again
    s = await summary(temporal_client, eid)
    assert sorted(contexts(s)) == ["parent.0", "parent.1"]  # one rewrite, not two
    assert counts(s, "parent.1") == {"completed": 1, "discarded": 1}
    assert contexts(s)["parent.1"].rewrite_of == "parent.0"
    r = await close(url, eid, {}, wait=True)
    assert r.json()["result"]["counts"] == {"selected": 2, "discarded": 1}


async def test_a_request_racing_a_delivery_gets_a_retryable_409_and_the_response_stays(
    gated_gateway, temporal_client, recording_engine
):
    """The ledger has completed call c0, its chat record is not written yet (the gate holds it), and a
    second request of the same context arrives: it must not discard c0 (which is about to be delivered)
    but get a retryable 409 naming the context and the call."""
    gw = gated_gateway
    eid = await start_episode(temporal_client, "race")
    messages = [SYSTEM, {"role": "user", "content": "Hi."}]
    async with http(gw.url, eid) as c:
        gw.store.arm()
        first = asyncio.create_task(c.post("/chat/completions", json=body(messages)))
        await asyncio.to_thread(gw.store.reached.wait, 240)  # the window is open: completed, no record
        racing = await c.post("/chat/completions", json=body(messages))
        held = await summary(temporal_client, eid)
        gw.store.release.set()
        delivered = await first
    assert racing.status_code == 409 and racing.headers["retry-after"] == "1"
    error = racing.json()["error"]
    assert error["code"] == "ResponsePendingError" and error["type"] == "conflict_error"
    assert "'parent.0.c0'" in error["message"] and "'parent.0'" in error["message"]
    assert counts(held, "parent.0") == {"completed": 1}  # nothing discarded, nothing admitted
    assert delivered.status_code == 200 and delivered.headers["x-grove-call-id"] == "parent.0.c0"
    # the delivered response is the head: the harness continues from it
    turn = [*messages, delivered.json()["choices"][0]["message"], {"role": "user", "content": "More."}]
    async with http(gw.url, eid) as c:
        nxt = await c.post("/chat/completions", json=body(turn))
    assert nxt.headers["x-grove-call-id"] == "parent.0.c1"
    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
    r = await close(gw.url, eid, {}, wait=True)
    assert r.json()["result"]["counts"] == {"selected": 2}


async def test_a_stream_dropped_mid_way_is_discarded_not_trained(gated_gateway, temporal_client):
    """A real client reads the first event of a streamed response and closes its connection: the call was
    never delivered whole, so it is discarded; the harness's re-send is a fresh call."""
    gw = gated_gateway
    eid = await start_episode(temporal_client, "dropped")
    messages = [SYSTEM, {"role": "user", "content": "Stream it."}]
    request = body(messages, stream=True, stream_options={"include_usage": True})
    gate = gw.sends.arm()
    async with http(gw.url, eid) as c:
        async with c.stream("POST", "/chat/completions", json=request) as r:
            assert r.status_code == 200 and r.headers["x-grove-call-id"] == "parent.0.c0"
            first = await anext(r.aiter_lines())
            assert first.startswith("data: {")
            await gate.held.wait()  # the server holds the rest of the stream
        # leaving the block closed the connection with the stream unread
        await gate.finished.wait()  # the server saw the client go and settled the call
    s = await summary(temporal_client, eid)
    assert counts(s, "parent.0") == {"discarded": 1} and contexts(s)["parent.0"].head is None
    # the harness re-sends it: a fresh root, read to the end this time
    async with http(gw.url, eid) as c, c.stream("POST", "/chat/completions", json=request) as r:
        assert r.headers["x-grove-call-id"] == "parent.0.c1"
        chunks, data = sse_chunks([line async for line in r.aiter_lines()])
    assert data[-1] == "[DONE]"
    r = await close(gw.url, eid, {}, wait=True)
    assert r.json()["result"]["counts"] == {"selected": 1, "discarded": 1}
