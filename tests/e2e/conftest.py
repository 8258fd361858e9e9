"""End-to-end fixtures: the real Temporal dev server, a real vLLM engine on the tiny model, a local
object store, and one in-process grove worker serving every task queue.

The engine is observed, not replaced: `RecordingEngine` is the real PolicyEngine that also keeps
what it served for each request (prompt ids, sampled ids, logprobs, version), so the tests can check
rows against the calls the engine actually served.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from activities.engine import EngineConfig, Generation, PolicyEngine
from grove import queues
from grove.worker import run_worker
from storage.local import LocalStore


@dataclass(frozen=True)
class Served:
    episode_id: str
    call_id: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    policy_version: int
    started: float  # monotonic seconds: when the engine got the request
    finished: float  # and when it returned


class RecordingEngine(PolicyEngine):
    """The real engine; every finished generation is also appended to `served`."""

    served: list[Served]

    async def generate(self, prompt_ids, sampling, seed, request_id) -> Generation:
        started = time.monotonic()
        gen = await super().generate(prompt_ids, sampling, seed, request_id)
        episode_id, call_id, _attempt = request_id.rsplit("/", 2)
        self.served.append(
            Served(
                episode_id, call_id, gen.prompt_ids, gen.completion_ids, gen.logprobs, gen.policy_version,
                started, time.monotonic(),
            )  # fmt: skip
        )
        return gen

    def calls_of(self, episode_id: str) -> dict[str, Served]:
        return {s.call_id: s for s in self.served if s.episode_id == episode_id}


@pytest.fixture(scope="session")
async def recording_engine(tiny_model_dir: Path):
    engine = await RecordingEngine.start(EngineConfig(model_dir=tiny_model_dir, max_model_len=1024))
    engine.served = []
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="session")
def e2e_store(tmp_path_factory) -> LocalStore:
    return LocalStore(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="session")
async def grove_worker(temporal_client, recording_engine, e2e_store, tiny_model_dir, tmp_path_factory):
    """All of grove's queues served in this process (task queues are per-session unique via namespace
    isolation of the session's own dev server)."""
    task = asyncio.create_task(
        run_worker(
            temporal_client,
            list(queues.ALL),
            store=e2e_store,
            model=str(tiny_model_dir),
            work_dir=tmp_path_factory.mktemp("worker"),
            device="cpu",
            engine=recording_engine,
        )
    )
    await asyncio.sleep(0.5)
    if task.done():
        task.result()  # surface a startup failure
    yield task
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
