"""A stream dropped while its delivery is on its way to the ledger: the request ends, the gateway idles.

Starlette cancels a streamed response whose client left, and the Temporal SDK reports that cancellation
as an Update timeout. A gateway that took it for a timeout and asked again would be cancelled again at
once, for ever: one core spinning, threads piling up, SIGTERM ignored, the context answered 409
`ResponsePendingError` for ever. What is checked: the request ends, CPU and threads stay idle, the
harness's re-send is served, the close counts what was delivered, SIGTERM stops the gateway.

Real services: the real `python -m gateway` process (its CPU time, threads and SIGTERM are measured),
the Temporal dev server, the session's grove worker (generation, io) and an episode worker this test
stops and starts, real client connections (raw httpx and the OpenAI client). The moment is made, not
waited for: the `delivery_commit` gate holds the response with every event but the last acknowledged by
the client; with the episode worker stopped, no Update or query of the episode can be answered, so the
gateway's delivery stays in flight (its workflow task pending at the server: a state that stays until
the test starts a worker again) while the client reads one event and closes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from temporalio.worker import Worker

from grove.contracts import EpisodeSpec, HarnessSpec
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.worker_process import wait_until
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.gateway.test_app_e2e import SECRET, SYSTEM, body, close, http, oai
from tests.gateway.test_delivery_races_e2e import trained
from workflows.episode import EpisodeWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

REPO = Path(__file__).resolve().parents[2]
IDLE_CPU = 0.10  # cores: an idle gateway's share over the window below (a spinning loop takes ~1)
WINDOW_S = 2.0  # seconds of CPU time measured after the drop
EXTRA_THREADS = 8  # threads a gateway may start on its own (thread pools filling up), not hundreds
STOP_WITHIN = 60.0  # seconds SIGTERM may take to stop the gateway (a bound, not a speed check)
FIRST = [SYSTEM, {"role": "user", "content": "Begin."}]


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen
    gates: GateControl

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def threads(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads line")

    async def cores_over(self, seconds: float) -> float:
        before, started = self.cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)  # a measuring window, not a wait for a moment
        return (self.cpu_seconds() - before) / (time.monotonic() - started)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def gateway(temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine, tmp_path):
    gates = GateControl(tmp_path / "gates")
    port = free_port()
    env = {
        **os.environ,
        "GROVE_GATEWAY_SECRET": SECRET,
        "PYTHONPATH": str(REPO),
        GATES_ENV: str(gates.root),
    }
    args = [
        "--port", str(port), "--address", temporal_server.address, "--store", str(e2e_store.root),
        "--model-name", "grove-tiny", "--policy-model", str(tiny_model_dir),
        "--max-model-len", str(recording_engine.config.max_model_len),
    ]  # fmt: skip
    log = (tmp_path / "gateway.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", *args], cwd=REPO, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"

    async def serving() -> bool:
        assert process.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
        try:
            async with httpx.AsyncClient() as c:
                return (await c.get(f"{url}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(serving, PROCESS_WAIT, "the gateway serving")
    try:
        yield Gateway(url, process, gates)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


@asynccontextmanager
async def episode_worker(client, queue: str) -> AsyncIterator[None]:
    """The episode's workflow worker, on a queue of its own; stopped when the block ends."""
    async with Worker(client, task_queue=queue, workflows=[EpisodeWorkflow]):
        yield


async def start(client, queue: str) -> str:
    run = f"drop-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8),
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queue)
    return spec.episode_id


async def until_held(gates: GateControl, point: str, key: str) -> None:
    """A gate held is a state that stays until the test releases it."""
    async with asyncio.timeout(STATE_WAIT):
        while key not in gates.held(point):
            await asyncio.sleep(0.02)


async def workflow_task_pending(client, episode_id: str) -> bool:
    """The server holds a workflow task of the episode that no worker takes (its worker is stopped): what
    an Update of the gateway makes, and what stays until a worker polls again."""
    desc = await client.get_workflow_handle(episode_id).describe()
    return desc.raw_description.HasField("pending_workflow_task")


async def read_one_event_and_close(kind: str, url: str, episode_id: str, turn: list) -> AsyncIterator[None]:
    """The client reads the stream's first event (first step) and then closes its connection with the
    rest unread (second step)."""
    if kind == "httpx":
        async with (
            http(url, episode_id) as c,
            c.stream("POST", "/chat/completions", json=body(turn, stream=True)) as r,
        ):
            assert r.status_code == 200 and r.headers["x-grove-call-id"] == "parent.0.c1"
            lines = r.aiter_lines()  # kept: a dropped line iterator closes the response when collected
            assert (await anext(lines)).startswith("data: {")
            yield
        return
    client = oai(url, episode_id)
    stream = await client.chat.completions.create(model="grove-tiny", messages=turn, stream=True)
    chunks = aiter(stream)  # kept, as above
    assert (await anext(chunks)).choices  # the first chunk
    yield
    await stream.close()  # what an Agents SDK program cancelling its streamed run does
    await client.close()


@pytest.mark.parametrize("kind", ["httpx", "openai"])
async def test_a_stream_dropped_while_its_delivery_is_in_flight_ends_and_idles(
    kind, gateway, temporal_client, e2e_store
):
    queue = f"drop-episodes-{uuid.uuid4().hex[:6]}"
    async with episode_worker(temporal_client, queue):
        eid = await start(temporal_client, queue)
        async with http(gateway.url, eid) as c:
            r = await c.post("/chat/completions", json=body(FIRST))
        assert r.status_code == 200 and r.headers["x-grove-call-id"] == "parent.0.c0"
        turn = [*FIRST, r.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
        threads_before = gateway.threads()
        key = f"{eid}/parent.0.c1"
        gateway.gates.arm("delivery_commit", f"^{re.escape(key)}$")
        client = read_one_event_and_close(kind, gateway.url, eid, turn)
        await anext(client)  # the first event read, the connection open
        await until_held(gateway.gates, "delivery_commit", key)  # every event but the last acknowledged
    # the episode worker is stopped: nothing of the episode can be answered until it starts again
    gateway.gates.disarm("delivery_commit")
    await wait_until(
        lambda: workflow_task_pending(temporal_client, eid), STATE_WAIT, "the gateway's Update at the server"
    )
    with pytest.raises(StopAsyncIteration):
        await anext(client)  # the client closes with the stream unread
    assert await gateway.cores_over(WINDOW_S) < IDLE_CPU  # the gateway waits; it does not spin
    async with episode_worker(temporal_client, queue):
        async with http(gateway.url, eid) as c:  # the harness sends its request again
            again = await c.post("/chat/completions", json=body(turn))
        assert again.status_code == 200, again.text  # not a 409 for ever: nothing is left delivering
        assert again.headers["x-grove-call-id"] == "parent.0.c2"
        result = (await close(gateway.url, eid, {}, wait=True)).json()["result"]
    assert result["counts"] == {"selected": 2, "discarded": 1}
    assert trained(e2e_store, result) == ["parent.0.c0", "parent.0.c2"]  # the dropped call is not trained
    assert await gateway.cores_over(WINDOW_S) < IDLE_CPU
    assert gateway.threads() <= threads_before + EXTRA_THREADS
    gateway.process.send_signal(signal.SIGTERM)
    gateway.process.wait(timeout=STOP_WITHIN)  # SIGTERM still stops it (TimeoutExpired if not)
