"""Shared pieces of the OpenCode tests: a real stack (Temporal dev server, vLLM on the tiny model with a
2,048-token context, the capture gateway on a free port, grove's workers) and helpers to start episodes
driven by the harness runner and read what the engine served.

The stack is module-scoped in each test file that uses it (`opencode_stack`); the harness queue is served
by a `grove worker --queues harness --gateway-url <the test's gateway>` subprocess, which a test may
SIGKILL and start again (infra/worker_process.py WorkerProcess).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from activities.engine_config import EngineConfig
from cli.worker import run_worker
from gateway.http.app import create_app
from gateway.http.settings import GatewaySettings
from grove import queues
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec, OpenCodeOptions, TaskSpec
from grove.gates import GateControl
from grove.sampling import SamplingConfig
from harnesses import delegation
from infra.worker_process import WorkerProcess, wait_until
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT
from tests.fixtures.worker import RecordingEngine

SECRET = "opencode-test-secret-0123456789"
MAX_MODEL_LEN = 2048  # the tiny model's positions; OpenCode's restricted lead prompt is ~1,850 tokens
# The run_harness heartbeat timeout of the relaunch tests: how long a SIGKILLed harness worker goes
# unnoticed before Temporal retries the launch. Not short: the runner heartbeats after two ledger queries
# every 2 s, so a timeout of T fails a live launch whose queries take ~T - 2 s (a loaded machine's dev
# server); and nothing beats while a launch is held at the `harness_exited` gate, where the test must kill
# the worker within ~T - 2 s of the launch's last beat, or the timeout hands the retry to that still-live
# worker (then attempt 3, not 2). At 5 s both margins were ~3 s.
RELAUNCH_HEARTBEAT_TIMEOUT_S = 60.0


REPO = Path(__file__).resolve().parents[2]


class HarnessWorker(WorkerProcess):
    """`grove worker --queues harness --gateway-url URL` as a subprocess of this checkout (killable)."""

    def __init__(self, *, gateway_url: str, root: Path, **kw) -> None:
        super().__init__("harness", [queues.HARNESS], **kw)
        self.gateway_url, self.root = gateway_url, root

    def env(self) -> dict[str, str]:
        return {**super().env(), "GROVE_GATEWAY_SECRET": SECRET, "PYTHONPATH": str(REPO)}

    def start(self) -> HarnessWorker:
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "cli.main", "worker", "--queues", queues.HARNESS,
            "--model", str(self.model), "--gateway-url", self.gateway_url,
            "--harness-dir", str(self.root), "--keep-harness-dirs",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=REPO,
            )  # fmt: skip
        return self


@dataclass
class Stack:
    client: object
    engine: RecordingEngine
    store: LocalStore
    gateway_url: str
    gates: GateControl
    harness_root: Path
    model_dir: Path
    harness: HarnessWorker


@contextlib.asynccontextmanager
async def opencode_stack(
    temporal_client, temporal_server, model_dir: Path, tmp: Path, max_model_len: int = MAX_MODEL_LEN
):
    """Engine (test gates from `tmp/gates`), gateway, one in-process worker on every queue but the
    harness queue, and a `grove worker --queues harness` subprocess for that one (tests may kill it)."""
    from tests.gateway.test_app_e2e import serving

    gates = GateControl(tmp / "gates")
    os.environ.update(gates.env)  # read by the engine and the harness worker when they start
    engine = await RecordingEngine.start(EngineConfig(model_dir=model_dir, max_model_len=max_model_len))
    engine.served = []
    store = LocalStore(tmp / "store")
    settings = GatewaySettings(
        temporal_address=temporal_server.address, store=str(store.root), secret=SECRET,
        policy_model=str(model_dir), max_model_len=max_model_len,
    )  # fmt: skip
    harness = None
    try:
        async with serving(create_app(settings)) as url:
            names = [q for q in queues.ALL if q != queues.HARNESS]
            task = asyncio.create_task(
                run_worker(
                    temporal_client,
                    names,
                    store=store,
                    model=str(model_dir),
                    work_dir=tmp / "worker",
                    device="cpu",
                    engine=engine,
                )  # fmt: skip
            )
            harness = HarnessWorker(
                gateway_url=url, root=tmp / "harness", address=temporal_server.address,
                store_url=store.root.as_uri(), model=model_dir, log_dir=tmp / "logs",
            ).start()  # fmt: skip
            await harness.wait_ready(temporal_client)
            if task.done():
                task.result()
            try:
                yield Stack(temporal_client, engine, store, url, gates, tmp / "harness", model_dir, harness)
            finally:
                harness.stop()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    finally:
        if harness is not None:
            harness.stop()
        await engine.shutdown()
        os.environ.pop("GROVE_TEST_GATES", None)


def opencode_spec(name: str, task: TaskSpec | None = None, *, max_tokens: int = 48, **harness) -> EpisodeSpec:
    run = f"oc-{name}-{uuid.uuid4().hex[:6]}"
    options = harness.pop("opencode", OpenCodeOptions())
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/s000001/t0", episode_id=f"{run}/s000001/t0/g0",
        task=task or delegation.make_task(3),
        harness=HarnessSpec(kind="opencode", opencode=options, **harness),
        sampling=SamplingConfig(max_tokens=max_tokens),
    )  # fmt: skip


def response_text(tokenizer, completion_ids) -> str:
    """The text a harness gets for a served completion, per the gateway's documented rule (written here
    from the rule, not with the engine's code): special tokens stay in the text (a policy can sample
    `<|im_start|>` mid-reply: seen in a loaded suite run), one final stop token is not part of it."""
    ids = list(completion_ids)
    stops = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    if ids and ids[-1] in stops:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


async def run_episode(client, spec: EpisodeSpec, timeout: float = RESULT_WAIT) -> EpisodeResult:
    handle = await client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    return await asyncio.wait_for(handle.result(), timeout)


def launch_events(root: Path, episode_id: str) -> list[dict]:
    """The OpenCode events the runner logged for the episode's (latest) launch."""
    from activities.harness import episode_folder

    path = episode_folder(root, episode_id) / "home" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


async def until_reached(probe: Callable[[], object], what: str, timeout: float) -> None:
    """Until a state the test created is reached: a gate it armed is held (grove/gates.py), which stays
    once reached, so this poll cannot miss it (tests/durability/helpers.py wait_until)."""

    async def reached() -> object:
        return probe()

    await wait_until(reached, timeout, what)
