"""A request that reaches the gateway before any grove worker serves its episode waits for one, within a
bound, instead of getting 503; `grove worker` says when it is ready; `/readyz`, `grove infra status`'s
queue lines and grove/queue_readiness.py read the same thing from Temporal.

Real services: a Temporal dev server of this module's own (no worker polls it until the test starts one),
the real gateway (uvicorn), a real `run_worker` that loads its own vLLM engine on the tiny model. The
moments are the test's: the gateway holds at `worker_wait` (its query failed and no worker polls the
episode's queue), the worker at `engine_start` (before its engine loads) (grove/gates.py).
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from cli.episode_commands import _show
from cli.queue_status import queue_lines
from gateway.http.app import create_app
from gateway.http.auth import issue_token
from gateway.http.settings import GatewaySettings
from grove import queues
from grove.client import connect
from grove.gates import ENV, GateControl
from grove.queue_readiness import readiness
from infra.temporal import TemporalDevServer
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.fixtures.worker import worker_running
from tests.gateway.test_app_e2e import MODEL, SECRET, base_url, serving, start_episode
from tests.harnesses.opencode_kit import until_reached

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

CONTEXT = 1024


async def test_an_early_request_waits_for_the_worker_and_the_worker_says_when_it_is_ready(
    tmp_path, monkeypatch, tiny_model_dir
):
    gates = GateControl(tmp_path / "gates")
    monkeypatch.setenv(ENV, str(gates.root))
    server = TemporalDevServer(tmp_path / "temporal").start()
    worker = contextlib.AsyncExitStack()  # the grove worker, once the test starts it
    try:
        client = await connect(server.address)
        store = LocalStore(tmp_path / "store")

        def settings(wait_s: float) -> GatewaySettings:
            return GatewaySettings(
                temporal_address=server.address, store=str(store.root), secret=SECRET, model_name=MODEL,
                policy_model=str(tiny_model_dir), max_model_len=CONTEXT, worker_wait_s=wait_s,
            )  # fmt: skip

        state = await readiness(client)
        assert not state.ready and state.waiting_for() == [
            "episodes (workflow worker)",
            "inference (activity worker)",
        ]

        # a gateway that will not wait: past its patience (0 s) the request is a 503 naming the queue
        eid = await start_episode(client, "no-worker")
        async with serving(create_app(settings(0.0))) as impatient:
            async with httpx.AsyncClient(timeout=RESULT_WAIT) as http:
                ready = await http.get(f"{impatient}/readyz")
            assert ready.status_code == 503 and ready.json()["waiting_for"] == state.waiting_for()
            refused = await _chat(impatient, eid)
        assert refused.status_code == 503, refused.text
        body = refused.json()["error"]
        assert body["code"] == "NoWorkerError" and "'episodes'" in body["message"]
        assert "grove worker" in body["message"]

        # the default gateway: the request waits for the worker instead
        gates.arm("worker_wait", ".")
        gates.arm("engine_start", ".")
        async with serving(create_app(settings(600.0))) as url:
            eid = await start_episode(client, "early")
            request = asyncio.create_task(_chat(url, eid))
            await until_reached(lambda: eid in gates.held("worker_wait"), "the request waits", STATE_WAIT)
            said: list[str] = []
            await worker.enter_async_context(
                worker_running(
                    client,
                    [queues.EPISODES, queues.IO, queues.INFERENCE],
                    store=store,
                    model=str(tiny_model_dir),
                    work_dir=tmp_path / "worker",
                    device="cpu",
                    engine_config={"max_model_len": CONTEXT},
                    say=said.append,
                )  # fmt: skip
            )
            await until_reached(
                lambda: gates.held("engine_start"), "the worker's engine about to load", STATE_WAIT
            )
            assert said == [
                f"worker: loading the inference engine ({tiny_model_dir}) for queue 'inference' ..."
            ]
            assert not request.done()  # still waiting, no 503
            assert not (await readiness(client)).ready  # nothing polls before the engine is loaded
            gates.disarm("engine_start")
            gates.disarm("worker_wait")
            response = await asyncio.wait_for(request, RESULT_WAIT)
            assert response.status_code == 200, response.text
            assert response.headers["x-grove-call-id"] == "parent.0.c0"  # admitted and generated once
            await until_reached(lambda: said[-1].startswith("worker ready"), "the ready line", STATE_WAIT)
            assert said[-1] == "worker ready: polling ['episodes', 'io', 'inference']"
            assert said[1].startswith("worker: engine loaded in ")
            async with httpx.AsyncClient(timeout=RESULT_WAIT) as http:
                ready = await http.get(f"{url}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        # `grove episode show` of the running episode: its one context, from the ledger
        shown = await _show(eid, server.address)
        assert shown[0] == f"episode   {eid}  running  contexts 1" and shown[-1] == "warnings  none"
        assert [line.split()[1:6] for line in shown[1:-1]] == [
            ["parent.0", "parent", "root", "head", "parent.0.c0"]
        ]
        assert [len(q["workers"]) for q in ready.json()["queues"]] == [1, 1]
        lines = await queue_lines(server.address)
        assert [line.split()[1:4] for line in lines] == [
            ["episodes", "workflow", "ready"],
            ["inference", "activity", "ready"],
            ["trainer", "activity", "waiting"],
            ["io", "activity", "ready"],
            ["harness", "activity", "waiting"],
        ]
    finally:
        await worker.aclose()
        server.stop()


async def _chat(url: str, episode_id: str) -> httpx.Response:
    """One chat request, as any OpenAI client sends it (no grove headers)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {issue_token(SECRET, episode_id)}"}
    async with httpx.AsyncClient(timeout=RESULT_WAIT) as http:
        return await http.post(f"{base_url(url, episode_id)}/chat/completions", json=body, headers=headers)
