"""Only delivered responses are trained, whatever races the close: delivery is decided in the
ledger (ledger/delivery.py), and a close freezes it.

Real services: the Temporal dev server, a grove worker with the real vLLM engine on the tiny model,
uvicorn serving the gateway, real client connections. Each race is made, not waited for, with test gates
(grove/gates.py): `generate` holds a finished generation inside the engine (the call still generating as
far as the episode knows), `delivery_check` holds a response before the ledger is asked whether it still
takes its delivery, `delivery_commit` holds it after that, just before its last-part checks (every
earlier part sent and acknowledged by the client's TCP: in the client's kernel), `delivery_settle` holds
an undelivered call before the gateway's own discard. What was trained is read from the rows the episode
wrote (which calls they own) and its result, never from the gateway.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gateway.http.app import create_app
from gateway.temporal.episode_client import Episodes, EpisodeUpdateRejectedError
from grove import queues
from grove.contracts import CallRequest, EpisodeSpec, HarnessSpec, PromptSpec
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl, Gates
from grove.receipts import ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.gateway.test_app_e2e import (
    SYSTEM,
    body,
    close,
    extension_of,
    gateway_settings,
    serving,
)
from tests.gateway.test_delivery_e2e import http
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


@dataclass
class Finished:
    """ASGI middleware: counts chat requests the app has returned from (their calls settled)."""

    app: object
    done: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
                self.done += 1
                self.changed.set()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(STATE_WAIT):
            while self.done < n:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Gated:
    url: str
    gates: GateControl
    finished: Finished
    other_url: str  # a second gateway on the same Temporal and store (another process, in effect)


@pytest.fixture(scope="module")
async def gated(
    temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine, tmp_path_factory
) -> AsyncIterator[Gated]:
    root = tmp_path_factory.mktemp("gates")
    previous = os.environ.get(GATES_ENV)
    os.environ[GATES_ENV] = str(root)  # read by the gateways' Capture when their lifespans start
    recording_engine._gates = Gates(root)  # the session's engine holds generations at `generate`
    settings = gateway_settings(temporal_server, e2e_store, tiny_model_dir, recording_engine)
    finished = Finished(create_app(settings))
    try:
        async with serving(finished) as url, serving(create_app(settings)) as other:
            yield Gated(url, GateControl(root), finished, other)
    finally:
        recording_engine._gates = None
        if previous is None:
            os.environ.pop(GATES_ENV, None)
        else:
            os.environ[GATES_ENV] = previous


async def until_held(gates: GateControl, point: str, key: str) -> None:
    """A gate held is a state that stays until the test releases it."""
    async with asyncio.timeout(STATE_WAIT):
        while key not in gates.held(point):
            await asyncio.sleep(0.02)


async def start(client, name: str, **fields) -> str:
    run = f"race-{name}-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8), **fields,
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


async def result_of(temporal_client, episode_id: str) -> dict:
    return await temporal_client.get_workflow_handle(episode_id).result()


def trained(store, result: dict) -> list[str]:
    """The calls whose loss the episode's rows carry (each trained call owned by exactly one row)."""
    rows = rows_from_parquet(store.get(result["rows_key"]))
    owned = [s.call_id for row in rows for s in row.spans if s.owned]
    assert len(owned) == len(set(owned)), owned
    return sorted(owned)


FIRST = [SYSTEM, {"role": "user", "content": "Begin."}]


async def first_call(url: str, episode_id: str) -> list:
    """parent.0.c0, delivered; returns the messages of a continuation of it."""
    async with http(url, episode_id) as c:
        r = await c.post("/chat/completions", json=body(FIRST))
    assert r.status_code == 200 and r.headers["x-grove-call-id"] == "parent.0.c0"
    return [*FIRST, r.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]


def generation_key(episode_id: str, call_id: str) -> str:
    return f"^{re.escape(episode_id)}/{re.escape(call_id)}/"


async def test_a_call_abandoned_while_generating_then_closed_is_never_trained(
    gated, temporal_client, e2e_store
):
    """The client times out while its call generates and the harness closes at once: the close freezes
    delivery, so the call completes undelivered and is discarded (a close that settled only what it saw
    would select the call when it completed, and train it)."""
    eid = await start(temporal_client, "abandon")
    base = gated.finished.done
    turn = await first_call(gated.url, eid)
    gated.gates.arm("generate", generation_key(eid, "parent.0.c1"))
    async with http(gated.url, eid) as c:
        waiting = asyncio.create_task(c.post("/chat/completions", json=body(turn)))
        held = await until_held_prefix(gated.gates, "generate", f"{eid}/parent.0.c1/")
        waiting.cancel()  # the client gives up: its connection closes while the call generates
        with pytest.raises(asyncio.CancelledError):
            await waiting
    r = await close(gated.url, eid, {}, wait=False)
    assert r.status_code == 200  # the close is accepted while the call still generates
    gated.gates.release("generate", held)
    result = await result_of(temporal_client, eid)
    await gated.finished.until(base + 2)  # the gateway saw the client gone and settled the call
    gated.gates.disarm("generate")
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0"]


async def until_held_prefix(gates: GateControl, point: str, prefix: str) -> str:
    async with asyncio.timeout(STATE_WAIT):
        while not (keys := [k for k in gates.held(point) if k.startswith(prefix)]):
            await asyncio.sleep(0.02)
    return keys[0]


async def test_a_client_gone_before_its_json_response_leaves_it_undelivered(
    gated, temporal_client, e2e_store
):
    """The common timeout without a close: the client gives up while the call generates; the finished
    call's response goes nowhere, the gateway discards the call at once, and the client's re-send is a
    fresh call of the same context."""
    eid = await start(temporal_client, "gone")
    base = gated.finished.done
    request = body([SYSTEM, {"role": "user", "content": "Take your time."}])
    gated.gates.arm("generate", generation_key(eid, "parent.0.c0"))
    async with http(gated.url, eid) as c:
        waiting = asyncio.create_task(c.post("/chat/completions", json=request))
        held = await until_held_prefix(gated.gates, "generate", f"{eid}/parent.0.c0/")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    gated.gates.release("generate", held)
    gated.gates.disarm("generate")
    await gated.finished.until(base + 1)  # the gateway saw the client gone and discarded the call
    async with http(gated.url, eid) as c:
        again = await c.post("/chat/completions", json=request)
    assert again.status_code == 200 and again.headers["x-grove-call-id"] == "parent.0.c1"
    result = (await close(gated.url, eid, {}, wait=True)).json()["result"]
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c1"]


async def test_a_response_ready_after_the_close_is_refused_to_a_waiting_client(
    gated, temporal_client, e2e_store
):
    """A client still waiting when the close is accepted gets the ledger's refusal, not the response:
    a delivery after the close does not count, so the client must not believe it was served."""
    eid = await start(temporal_client, "late")
    turn = await first_call(gated.url, eid)
    gated.gates.arm("generate", generation_key(eid, "parent.0.c1"))
    async with http(gated.url, eid) as c:
        waiting = asyncio.create_task(c.post("/chat/completions", json=body(turn)))
        held = await until_held_prefix(gated.gates, "generate", f"{eid}/parent.0.c1/")
        assert (await close(gated.url, eid, {}, wait=False)).status_code == 200
        gated.gates.release("generate", held)
        refused = await waiting
    gated.gates.disarm("generate")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "DeliveryRefusedError" and "'parent.0.c1'" in error["message"]
    result = await result_of(temporal_client, eid)
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0"]


async def test_a_stream_read_one_chunk_then_dropped_and_closed_is_never_trained(
    gated, temporal_client, e2e_store
):
    """A client reads the first chunk of a stream and closes its connection while the rest of the stream
    (all but its last event) is already in its kernel; the harness closes the episode before the
    gateway's own discard of the call reaches the workflow. The last event waits for the earlier ones to
    be acknowledged and the client to be still there; it is not sent, and the close discards the
    undelivered call (not trained)."""
    eid = await start(temporal_client, "dropped")
    base = gated.finished.done
    turn = await first_call(gated.url, eid)
    key = f"{eid}/parent.0.c1"
    gated.gates.arm("delivery_commit", f"^{re.escape(key)}$")
    gated.gates.arm("delivery_settle", f"^{re.escape(key)}$")
    request = body(turn, stream=True, stream_options={"include_usage": True})
    async with http(gated.url, eid) as c:
        async with c.stream("POST", "/chat/completions", json=request) as r:
            assert r.status_code == 200 and r.headers["x-grove-call-id"] == "parent.0.c1"
            lines = r.aiter_lines()  # kept: a dropped line iterator closes the response when collected
            first = await anext(lines)
            assert first.startswith("data: {")
            await until_held(gated.gates, "delivery_commit", key)  # the rest, but [DONE], was acknowledged
        # leaving the block closed the connection with the stream unread
        await until_held(gated.gates, "delivery_settle", key)  # the server saw it go: not delivered
    r = await close(gated.url, eid, {}, wait=True)  # before the gateway's own discard
    result = r.json()["result"]
    gated.gates.disarm("delivery_settle")  # the gateway's discard now comes after the close: refused
    gated.gates.disarm("delivery_commit")
    await gated.finished.until(base + 2)
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0"]


async def test_a_discard_after_the_close_is_refused_and_changes_nothing_materialised(
    gated, temporal_client, e2e_store, recording_engine
):
    """Every discard after the close is refused, and rows own exactly the selected calls (a discard
    accepted after the close would change the ledger after its pages were written: rows owning a call the
    result counts `discarded`). The close is held open by a call still
    generating (the window in which the workflow waits before freezing); the ledger is paged (one item a
    page), so materialize reads it from the store, as in the long episode."""
    eid = await start(temporal_client, "discard", ledger_page_items=1)
    turn = await first_call(gated.url, eid)
    other = [SYSTEM, {"role": "user", "content": "Another task."}]
    async with http(gated.url, eid) as c:
        r = await c.post("/chat/completions", json=body(other), headers={"x-grove-agent": "other"})
    assert r.headers["x-grove-call-id"] == "other.0.c0"
    gated.gates.arm("generate", generation_key(eid, "parent.0.c1"))
    async with http(gated.url, eid) as c:
        waiting = asyncio.create_task(c.post("/chat/completions", json=body(turn)))
        held = await until_held_prefix(gated.gates, "generate", f"{eid}/parent.0.c1/")
        assert (await close(gated.url, eid, {}, wait=False)).status_code == 200
        with pytest.raises(EpisodeUpdateRejectedError) as err:  # what a racing retry's discard gets
            await Episodes(temporal_client).discard(eid, "other.0.c0", "the harness sent it again")
        gated.gates.release("generate", held)
        late = await waiting
    gated.gates.disarm("generate")
    assert err.value.error_type == "Closing" and "changes nothing" in str(err.value)
    assert late.status_code == 409  # parent.0.c1 completed after the close: not delivered
    result = await result_of(temporal_client, eid)
    assert result["counts"] == {"selected": 2, "discarded": 1}
    assert trained(e2e_store, result) == ["other.0.c0", "parent.0.c0"]
    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")  # it was generated


async def test_a_head_a_stopped_gateway_never_delivered_is_discarded_by_the_next_request(
    gated, temporal_client, e2e_store
):
    """A gateway that wrote a response's record and stopped before its last part (held here at
    `delivery_check`) leaves a completed head awaiting delivery. Another gateway (the restarted one)
    that gets the harness's re-send discards that head as never delivered and serves the request as a
    fresh call; the first gateway's late delivery is refused by the ledger."""
    eid = await start(temporal_client, "stopped")
    request = body([SYSTEM, {"role": "user", "content": "Once."}])
    key = f"{eid}/parent.0.c0"
    gated.gates.arm("delivery_check", f"^{re.escape(key)}$")
    async with http(gated.url, eid) as c:
        stuck = asyncio.create_task(c.post("/chat/completions", json=request))
        await until_held(gated.gates, "delivery_check", key)
        async with http(gated.other_url, eid) as again:
            resent = await again.post("/chat/completions", json=request)
        gated.gates.disarm("delivery_check")
        late = await stuck
    assert resent.status_code == 200 and resent.headers["x-grove-call-id"] == "parent.0.c1"
    assert late.status_code == 409 and late.json()["error"]["code"] == "DeliveryRefusedError"
    result = (await close(gated.url, eid, {}, wait=True)).json()["result"]
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c1"]


async def test_a_response_never_delivered_is_discarded_at_close_unless_it_spawned_a_worker(
    gated, temporal_client, e2e_store
):
    """Calls whose delivery was never recorded (the gateway stopped after the ledger completed them):
    the close discards them, except one that spawned a worker (the harness evidently had it)."""
    eid = await start(temporal_client, "unrecorded")
    episodes = Episodes(temporal_client)
    for agent in ("parent", "loner"):
        await episodes.open_context(
            eid, ContextRecord(context_id=f"{agent}.0", agent=agent, origin=ContextOrigin.ROOT)
        )
        await episodes.call(
            eid,
            CallRequest(
                call_id=f"{agent}.0.c0", context_id=f"{agent}.0", prompt=PromptSpec(ids=[11, 12, 13]),
                await_delivery=True,
            ),
        )  # fmt: skip
    worker = {"x-grove-agent": "worker-1", "x-grove-spawned-by": "parent.0.c0"}
    async with http(gated.url, eid) as c:
        r = await c.post("/chat/completions", json=body(FIRST), headers=worker)
    assert r.status_code == 200 and r.headers["x-grove-context"] == "worker-1.0"
    result = (await close(gated.url, eid, {}, wait=True)).json()["result"]
    assert result["counts"] == {"selected": 2, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0", "worker-1.0.c0"]


async def test_a_delivery_asked_again_after_a_close_gets_the_same_answer(gated, temporal_client, e2e_store):
    """A `deliver` whose answer timed out is asked again with the same id; after a hand-over that reaches
    the next run as a new Update, and a close may have come in between. A delivery the ledger counted is
    accepted again after the close (a new Update id stands for the next run), the same answer as before
    the close; one it never counted is refused; the rows own exactly the delivered call."""
    eid = await start(temporal_client, "again")
    base = gated.finished.done
    turn = await first_call(gated.url, eid)
    await gated.finished.until(base + 1)  # parent.0.c0's delivery recorded
    gated.gates.arm("generate", generation_key(eid, "parent.0.c1"))
    handle = temporal_client.get_workflow_handle(eid)
    async with http(gated.url, eid) as c:
        waiting = asyncio.create_task(c.post("/chat/completions", json=body(turn)))
        held = await until_held_prefix(gated.gates, "generate", f"{eid}/parent.0.c1/")
        assert (await close(gated.url, eid, {}, wait=False)).status_code == 200  # held open by parent.0.c1
        await handle.execute_update("deliver", "parent.0.c0", id="deliver/parent.0.c0/next-run")
        gated.gates.release("generate", held)
        late = await waiting
    gated.gates.disarm("generate")
    assert late.status_code == 409 and late.json()["error"]["code"] == "DeliveryRefusedError"
    result = await result_of(temporal_client, eid)
    assert result["counts"] == {"selected": 1, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0"]
