"""Measuring prompts never blocks the gateway (gateway/intake/tokenization.py), on real services.

Over-long prompts are refused in parallel, not one after another behind the episode's planning, and
another episode's calls go on meanwhile. Here an exact measurement of a large, legitimate prompt of
episode A is held in the tokenization pool's worker process (gate `tokenize`), holding A's planning too;
meanwhile:

- four concurrent 3.9 MB over-long prompts of A are all refused (400 `context_length_exceeded`, "at
  least N tokens"): by the lower bound, without waiting for A's planning or the pool;
- a large prompt of episode C that would pass the cap on bytes being measured gets 503
  `TokenizerBusyError` with Retry-After;
- a call of episode B is served.

Only then is A's measurement released, and A's call is served. Had any of them waited on the held
measurement, the test would hang until its bound. The latency ratio under load is a benchmark
(bench/bench_gateway_tokenize.py), not a test.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from fastapi import FastAPI

from gateway.http.app import create_app
from gateway.http.settings import GatewaySettings
from gateway.intake.tokenization import TokenizationLimits
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.gateway.test_app_e2e import MODEL, SECRET, SYSTEM, body, close, serving, start_episode
from tests.gateway.test_delivery_e2e import http

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

# ~1 KB of text (a few hundred tokens of the tiny model) is measured in the pool; 2 KB at once at most
LIMITS = TokenizationLimits(processes=1, in_process_below=512, max_bytes=2048)
LARGE = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(18))  # ~1 KB
LARGER = LARGE + LARGE[:600]  # ~1.6 KB: with LARGE being measured, past the 2 KB cap
OVERLONG = "x" * 3_900_000


@asynccontextmanager
async def gated_gateway(
    root, temporal_server, e2e_store, tiny_model_dir, recording_engine, **settings
) -> AsyncIterator[tuple[str, FastAPI]]:
    """A gateway on the tiny model with test gates under `root` (its spawned worker processes inherit
    them): its URL and app."""
    previous = os.environ.get(GATES_ENV)
    os.environ[GATES_ENV] = str(root)
    settings = GatewaySettings(
        temporal_address=temporal_server.address, store=str(e2e_store.root), secret=SECRET, model_name=MODEL,
        policy_model=str(tiny_model_dir), max_model_len=recording_engine.config.max_model_len, **settings,
    )  # fmt: skip
    app = create_app(settings)
    try:
        async with serving(app) as url:
            yield url, app
    finally:
        if previous is None:
            os.environ.pop(GATES_ENV, None)
        else:
            os.environ[GATES_ENV] = previous


@pytest.fixture(scope="module")
async def gateway(
    temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine, tmp_path_factory
):
    root = tmp_path_factory.mktemp("gates")
    services = (temporal_server, e2e_store, tiny_model_dir, recording_engine)
    async with gated_gateway(root, *services, tokenization=LIMITS) as (url, _):
        yield url, GateControl(root)


def ask(text: str) -> dict:
    return body([SYSTEM, {"role": "user", "content": text}])


async def test_over_long_prompts_are_refused_in_parallel_and_others_are_served_while_one_is_measured(
    gateway, temporal_client
):
    url, gates = gateway
    a, b, c = [await start_episode(temporal_client, name) for name in ("tok-a", "tok-b", "tok-c")]
    gates.arm("tokenize", f"^{re.escape(a)}/")
    async with http(url, a) as ca, http(url, b) as cb, http(url, c) as cc:
        measured = asyncio.create_task(ca.post("/chat/completions", json=ask(LARGE)))
        async with asyncio.timeout(STATE_WAIT):  # the pool's worker starts with it (it loads the tokenizer)
            while not gates.held("tokenize"):
                assert not measured.done(), measured.result().text
                await asyncio.sleep(0.05)
        refused = await asyncio.gather(*(ca.post("/chat/completions", json=ask(OVERLONG)) for _ in range(4)))
        busy = await cc.post("/chat/completions", json=ask(LARGER))
        served = await cb.post("/chat/completions", json=ask("Hi."))
        assert not measured.done()  # all of the above while A's prompt is still being measured
        gates.disarm("tokenize")
        done = await measured
    for r in refused:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert (
        busy.json()["error"]["code"] == "TokenizerBusyError"
        and "max_bytes" in busy.json()["error"]["message"]
    )
    assert served.status_code == 200 and served.headers["x-grove-call-id"] == "parent.0.c0"
    assert done.status_code == 200 and done.headers["x-grove-call-id"] == "parent.0.c0"
    for eid in (a, b, c):
        result = (await close(url, eid, {}, wait=True)).json()["result"]
        assert result["counts"] == ({} if eid == c else {"selected": 1})
