"""An Update whose answer times out is waited for again, not reported as Temporal being down.

A loaded demo step lost an OpenCode episode: the lead's call was admitted and generating when Temporal's
answer to the gateway's `call` Update timed out; the gateway answered 503, OpenCode re-sent the request,
the gateway refused it five times (409: the head still generating) and OpenCode gave up. Here the
timeout is made on purpose on a real dev server: an Update held by the workflow until the test releases
it, asked with a 1-second RPC timeout, so every answer before the release times out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from datetime import timedelta

import anyio
import pytest
from temporalio import workflow
from temporalio.worker import Worker

from gateway.temporal.episode_client import Episodes, UpdateOutcomeTimeoutError
from infra.worker_process import wait_until
from tests.bounds import RESULT_WAIT, STATE_WAIT


@workflow.defn
class HeldUpdateWorkflow:
    """An Update that runs until the test signals `release`, like a call until its generation ends."""

    def __init__(self) -> None:
        self.released = False
        self.runs = 0
        self.done = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.done)
        return self.runs

    @workflow.update(name="call")
    async def call(self, word: str) -> str:
        self.runs += 1
        await workflow.wait_condition(lambda: self.released)
        return word.upper()

    @workflow.query
    def started(self) -> int:
        return self.runs

    @workflow.signal
    def release(self) -> None:
        self.released = True

    @workflow.signal
    def finish(self) -> None:
        self.done = True


async def test_a_timed_out_update_answer_is_awaited_again_on_the_same_update(temporal_client):
    queue = f"held-{uuid.uuid4().hex[:8]}"
    wid = f"held-{uuid.uuid4().hex[:8]}"
    episodes = Episodes(temporal_client)
    async with Worker(temporal_client, task_queue=queue, workflows=[HeldUpdateWorkflow]):
        handle = await temporal_client.start_workflow(HeldUpdateWorkflow.run, id=wid, task_queue=queue)

        def ask() -> Awaitable[str]:  # what Episodes.call sends, with a 1-s RPC timeout
            return handle.execute_update(
                "call", "red", id="call/parent.0.c0/n1", result_type=str, rpc_timeout=timedelta(seconds=1)
            )

        outcome = asyncio.create_task(episodes._through_handover(wid, "call parent.0.c0", ask))

        async def timed_out_twice() -> bool:
            if outcome.done():  # without the wait it ends here, in an error (503 to the harness)
                outcome.result()
            return episodes.outcome_waits >= 2

        await wait_until(timed_out_twice, STATE_WAIT, "two timed-out answers of the held Update")
        await handle.signal(HeldUpdateWorkflow.release)
        assert await asyncio.wait_for(outcome, RESULT_WAIT) == "RED"
        await handle.signal(HeldUpdateWorkflow.finish)
        assert await handle.result() == 1  # every ask after a timeout reached the same Update: it ran once


# A request that is cancelled ends within this (a bound only turns the old endless loop into a failure).
CANCELLED_WITHIN = 60.0


async def started(handle) -> bool:
    return await handle.query(HeldUpdateWorkflow.started) >= 1


async def test_a_cancelled_request_stops_asking_and_never_spins(temporal_client):
    """Starlette cancels a response whose client left (an anyio cancel scope, which cancels every later
    await of the task too). The SDK reports that cancellation as WorkflowUpdateRPCTimeoutOrCancelledError;
    taken for Temporal's timeout and asked again, each new ask would be cancelled at once, for ever (one
    core spinning, the request never ending). A cancellation ends the request at once, and the Update is
    not asked again."""
    queue, wid = f"held-{uuid.uuid4().hex[:8]}", f"held-{uuid.uuid4().hex[:8]}"
    episodes = Episodes(temporal_client)
    async with Worker(temporal_client, task_queue=queue, workflows=[HeldUpdateWorkflow]):
        handle = await temporal_client.start_workflow(HeldUpdateWorkflow.run, id=wid, task_queue=queue)
        scope = anyio.CancelScope()

        async def request() -> None:
            with scope:  # what Starlette runs a streamed response in
                await episodes._through_handover(
                    wid, "deliver parent.0.c0",
                    lambda: handle.execute_update("call", "red", id="deliver/parent.0.c0", result_type=str),
                )  # fmt: skip

        task = asyncio.create_task(request())
        await wait_until(lambda: started(handle), STATE_WAIT, "the Update running in the workflow")
        cpu = time.process_time()
        scope.cancel()  # the client left while the Update is in flight
        done, _ = await asyncio.wait({task}, timeout=CANCELLED_WITHIN)
        spun = time.process_time() - cpu
        assert task in done, (
            f"the cancelled request still runs after {CANCELLED_WITHIN:g} s ({spun:.1f} s CPU)"
        )
        task.result()  # ended by its cancel scope, no error
        assert episodes.outcome_waits == 0  # a cancellation is not a timeout: never asked again
        await handle.signal(HeldUpdateWorkflow.release)
        await handle.signal(HeldUpdateWorkflow.finish)
        assert await handle.result() == 1


async def test_timed_out_answers_are_asked_again_with_backoff_within_a_deadline(temporal_client):
    """Answers that keep timing out are asked again with a growing pause, and not past the gateway's
    outcome patience: then the request gets 503 (UpdateOutcomeTimeoutError)."""
    queue, wid = f"held-{uuid.uuid4().hex[:8]}", f"held-{uuid.uuid4().hex[:8]}"
    episodes = Episodes(temporal_client)
    episodes.outcome_patience = 3.0
    async with Worker(temporal_client, task_queue=queue, workflows=[HeldUpdateWorkflow]):
        handle = await temporal_client.start_workflow(HeldUpdateWorkflow.run, id=wid, task_queue=queue)

        def ask() -> Awaitable[str]:
            return handle.execute_update(
                "call", "red", id="call/parent.0.c0/n1", result_type=str, rpc_timeout=timedelta(seconds=1)
            )

        started_at = time.monotonic()
        with pytest.raises(UpdateOutcomeTimeoutError, match="kept timing out for 3 s"):
            await asyncio.wait_for(episodes._through_handover(wid, "call parent.0.c0", ask), CANCELLED_WITHIN)
        assert time.monotonic() - started_at >= 3.0
        assert 2 <= episodes.outcome_waits <= 6  # each ask took its 1-s timeout plus the pause
        await handle.signal(HeldUpdateWorkflow.release)
        await handle.signal(HeldUpdateWorkflow.finish)
        assert await handle.result() == 1
