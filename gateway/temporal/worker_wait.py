"""A request that reaches the gateway before a grove worker serves its episode waits for one, within a
bound, instead of failing.

Deciding a request needs the episode workflow's ledger (its `context_view` query), which only a worker polling
the workflow's task queue can answer. A worker that is still starting (`grove worker` loads its vLLM engine
before it polls any queue: cli/worker.py) is not polling yet, and Temporal holds a query to such a workflow
until the client gives up (the query fails after ~30 s); a harness answered 503 then retries or dies,
depending on its client's retries. So when a query fails and Temporal lists no live worker on the workflow's
queue (grove/queue_readiness.py), the request asks again until one polls, for `patience` seconds
(GatewaySettings.worker_wait_s, default 600); past that it gets 503 `NoWorkerError` naming the queue and what
to start. A query that fails while a worker does poll is Temporal's own trouble: asked again while the answer
is transient (gateway/temporal/retry_policy.py), then 503.

Updates need no such wait: Temporal keeps an Update until a worker takes it, and the gateway asks again
whenever its answer times out (gateway/temporal/episode_client.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.client import Client
from temporalio.service import RPCError

from grove.gates import Gates
from grove.queue_readiness import queue_state

T = TypeVar("T")
log = logging.getLogger("grove.gateway")

WORKER_PATIENCE_S = 600.0  # how long a request waits for a worker to poll its episode's queue
RETRY_EVERY_S = 1.0  # between a failed query and the next (a query without a worker blocks ~30 s itself)


async def served_queue(client: Client, episode_id: str) -> str | None:
    """The task queue of the episode's workflow; None when Temporal cannot say."""
    try:
        return (await client.get_workflow_handle(episode_id).describe()).task_queue
    except RPCError:
        return None


async def unserved(client: Client, episode_id: str) -> str | None:
    """The episode's workflow queue when no live worker polls it (else None: it is served, or unknown)."""
    queue = await served_queue(client, episode_id)
    if queue is None:
        return None
    try:
        state = await queue_state(client, queue, "workflow")
    except RPCError:
        return None
    return None if state.ready else queue


async def when_served(
    client: Client,
    episode_id: str,
    what: str,
    query: Callable[[], Awaitable[T]],
    unavailable: type[Exception],
    no_worker: Callable[[str], Exception],
    patience: float = WORKER_PATIENCE_S,
) -> T:
    """`query()`, asked again while it fails with `unavailable` and no worker polls the episode's
    workflow queue, for `patience` seconds at most; then `no_worker(message)` is raised (module
    docstring: gateway/temporal/episode_client.py's NoWorkerError, HTTP 503)."""
    deadline = time.monotonic() + patience
    gates = Gates.from_env()
    # A failure found served is asked once more: the worker may have come between the failure and the check
    # (the query's own transient retries stop as soon as no worker polls: gateway/temporal/episode_client.py)
    again = True
    while True:
        try:
            return await query()
        except unavailable:
            queue = await unserved(client, episode_id)
            if queue is None:
                if not again:
                    raise  # a worker polls (or Temporal cannot tell): not a worker still starting
                again = False
                continue
            again = True
            if time.monotonic() > deadline:
                raise no_worker(
                    f"episode {episode_id!r}: {what}: no grove worker has polled the workflow task queue "
                    f"{queue!r} for {patience:g} s; start one (`grove worker --queues {queue},...`; "
                    "`grove infra status` lists the queues' workers), then send the request again"
                ) from None
            log.info("episode %r: %s waits for a worker to poll %r", episode_id, what, queue)
            if gates is not None:  # tests: the request waits for a worker
                await gates.hold("worker_wait", episode_id)
            await asyncio.sleep(RETRY_EVERY_S)
