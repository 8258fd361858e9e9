"""What the episode benchmarks share: real services in this process (a Temporal dev server on a temporary
SQLite file, a grove worker serving the episodes, io and inference queues with vLLM on tiny-random), an
external episode's spec, and one chat call through the gateway as an agent of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.client import Client

from cli.worker import run_worker
from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from grove import queues
from grove.client import connect
from grove.contracts import EpisodeSpec, HarnessSpec
from grove.headers import AGENT_HEADER
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.temporal import TemporalDevServer
from storage.local import LocalStore

MAX_MODEL_LEN = 256  # the worker's engine and the gateway alike


@dataclass(frozen=True)
class Services:
    address: str
    client: Client
    store: LocalStore


@contextlib.asynccontextmanager
async def services(tmp: Path) -> AsyncIterator[Services]:
    server = TemporalDevServer(tmp / "temporal").start()
    worker = None
    try:
        client = await connect(server.address)
        store = LocalStore(tmp / "store")
        worker = asyncio.create_task(
            run_worker(client, [queues.EPISODES, queues.IO, queues.INFERENCE], store=store,
                       model="tiny-random", work_dir=tmp / "worker", device="cpu",
                       engine_config={"max_model_len": MAX_MODEL_LEN})
        )  # fmt: skip
        yield Services(server.address, client, store)
    finally:
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker
        server.stop()


def episode_spec(prefix: str, **fields: object) -> EpisodeSpec:
    """An external episode whose calls generate one token."""
    run = f"{prefix}-{uuid.uuid4().hex[:6]}"
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=1), **fields,
    )  # fmt: skip


def gateway_client(url: str, secret: str, episode_id: str) -> httpx.AsyncClient:
    auth = {"authorization": f"Bearer {issue_token(secret, episode_id)}"}
    return httpx.AsyncClient(
        base_url=f"{url}/episodes/{episode_ref(episode_id)}/v1", headers=auth, timeout=600
    )


async def agent_call(http: httpx.AsyncClient, agent: str, text: str) -> float:
    """One chat call as agent `agent` (its own context); its latency in seconds."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    t = time.monotonic()
    r = await http.post(
        "/chat/completions",
        json={"model": "grove", "messages": messages, "max_tokens": 1},
        headers={AGENT_HEADER: agent},
    )
    if r.status_code != 200:
        raise RuntimeError(f"{agent}: {r.status_code} {r.text[:300]}")
    return time.monotonic() - t
