"""Large bodies never hold the gateway (gateway/intake/large_bodies.py, gateway/intake/body_parse.py), on real
services.

Episode A's 3.9 MB over-long prompt is held while it is being decoded in a body worker process (gate
`body_parse`). Meanwhile:

- A's next large body waits for A's turn, unread (seen in the gateway's admission state);
- one more large body of A is past A's backlog: 429 `LargeBodyBacklogError` with Retry-After, naming A
  and the bound, before its body is read;
- a 3.9 MB over-long prompt of episode C is decoded by the other worker and refused (400
  `context_length_exceeded`, "at least N tokens");
- a call of episode B is served.

Only then is A's decoding released, and both of A's bodies are refused as over-long. Had any of the above
waited on the held body, the test would hang until its bound. The latency ratio under load is a benchmark
(bench/bench_gateway_tokenize.py), not a test.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from gateway.intake.large_bodies import BodyAdmissionLimits
from grove.gates import GateControl
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.gateway.test_app_e2e import SYSTEM, body, close, start_episode
from tests.gateway.test_delivery_e2e import http
from tests.gateway.test_tokenization_e2e import gated_gateway

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

BODIES = BodyAdmissionLimits(processes=2, per_episode=1, max_waiting=1)
OVERLONG = "x" * 3_900_000


@pytest.fixture(scope="module")
async def gateway(
    temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine, tmp_path_factory
):
    root = tmp_path_factory.mktemp("gates")
    services = (temporal_server, e2e_store, tiny_model_dir, recording_engine)
    async with gated_gateway(root, *services, bodies=BODIES) as (url, app):  # body workers get the gates
        yield url, app, GateControl(root)


def ask(text: str) -> dict:
    return body([SYSTEM, {"role": "user", "content": text}])


async def until(condition, what: str) -> None:
    try:
        async with asyncio.timeout(STATE_WAIT):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not reached in {STATE_WAIT} s: {what}")


def over_long(r) -> bool:
    error = r.json()["error"]
    return (
        r.status_code == 400 and error["code"] == "context_length_exceeded" and "at least" in error["message"]
    )


async def test_another_episode_is_served_while_large_bodies_are_decoded_and_a_backlog_is_refused(
    gateway, temporal_client
):
    url, app, gates = gateway
    admission = app.state.body_admission
    a, b, c = [await start_episode(temporal_client, name) for name in ("body-a", "body-b", "body-c")]
    gates.arm("body_parse", f"^{re.escape(a)}$")
    async with http(url, a) as ca, http(url, b) as cb, http(url, c) as cc:
        held = asyncio.create_task(ca.post("/chat/completions", json=ask(OVERLONG)))
        await until(lambda: gates.held("body_parse") or held.done(), "A's body held in a worker")
        assert not held.done(), held.result().text
        waiting = asyncio.create_task(ca.post("/chat/completions", json=ask(OVERLONG)))
        await until(lambda: admission.waiting(a) == 1 or waiting.done(), "A's next body waiting")
        assert not waiting.done(), waiting.result().text
        backlog = await ca.post("/chat/completions", json=ask(OVERLONG))
        other = await cc.post("/chat/completions", json=ask(OVERLONG))
        served = await cb.post("/chat/completions", json=ask("Hi."))
        assert not held.done() and not waiting.done()  # all of the above while A's body is held
        gates.disarm("body_parse")
        first, second = await held, await waiting
    assert backlog.status_code == 429 and backlog.headers["retry-after"] == "1", backlog.text
    error = backlog.json()["error"]
    assert error["code"] == "LargeBodyBacklogError" and error["type"] == "rate_limit_error"
    assert repr(a) in error["message"] and "max_waiting = 1" in error["message"]
    assert over_long(other), other.text
    # B's first call; on a loaded machine its first attempt may be lost and the call complete as an
    # attempt `.r<k>` of the same id (ledger/settled.py), which is served all the same
    assert served.status_code == 200, served.text
    assert re.fullmatch(r"parent\.0\.c0(\.r\d+)?", served.headers["x-grove-call-id"])
    assert over_long(first) and over_long(second), (first.text, second.text)
    assert admission.in_progress == 0 and admission.waiting(a) == 0
    for eid in (a, b, c):
        result = (await close(url, eid, {}, wait=True)).json()["result"]
        if eid == b:  # a lost first attempt (above) counts as its own dead call beside the selected one
            assert result["counts"]["selected"] == 1, result["counts"]
        else:
            assert result["counts"] == {}, result["counts"]
