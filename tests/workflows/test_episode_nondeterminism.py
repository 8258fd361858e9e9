"""An episode whose code can no longer replay its own history fails at once (workflows/episode.py,
EPISODE_FAILURE_TYPES) instead of retrying its workflow task until the run's bound: the run then counts it
as an infrastructure failure and its step goes on (tests/e2e/test_group_outcomes.py covers that half).

The drift is made the way it happens in production, on a real dev server: a worker runs the episode's
first workflow task and goes away; the next worker to pick the episode up has no cached state, replays
the history, and its code emits another command there (a timer the history does not have).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from workflows.episode import EpisodeWorkflow
from workflows.handover import EpisodeRun

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

# the episode's own failure types, whatever they are: the drifted copy differs from it only in its code
EPISODE_DEFINITION = workflow._Definition.must_from_class(EpisodeWorkflow)


@workflow.defn(name="EpisodeWorkflow", failure_exception_types=EPISODE_DEFINITION.failure_exception_types)
class DriftedEpisode(EpisodeWorkflow):
    """The episode with one command more at its start: what a worker running changed code replays."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(spec)


async def first_task_completed(handle: WorkflowHandle) -> None:
    """Until the episode's first workflow task is in its history (a state that stays once reached)."""
    deadline = asyncio.get_running_loop().time() + STATE_WAIT
    while True:
        events = [e.event_type async for e in handle.fetch_history_events()]
        if EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in events:
            return
        assert asyncio.get_running_loop().time() < deadline, (
            f"no workflow task completed in {STATE_WAIT:.0f} s"
        )
        await asyncio.sleep(0.2)


def worker(client: Client, queue: str, workflow_class: type) -> Worker:
    # unsandboxed: the drifted class lives in this test module; replay and its checks are the SDK core's
    return Worker(
        client, task_queue=queue, workflows=[workflow_class], workflow_runner=UnsandboxedWorkflowRunner()
    )


async def test_an_episode_whose_history_no_longer_replays_fails_instead_of_waiting(temporal_client):
    queue = f"drift-{uuid.uuid4().hex[:8]}"
    run = f"drift-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8),
    )  # fmt: skip
    async with worker(temporal_client, queue, EpisodeWorkflow):
        handle = await temporal_client.start_workflow(
            EpisodeWorkflow.run, spec, id=spec.episode_id, task_queue=queue
        )
        await first_task_completed(handle)  # an external episode now waits for its harness's calls
    async with worker(temporal_client, queue, DriftedEpisode):
        await handle.cancel()  # a new workflow task: the drifted worker replays the history to run it
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert "nondetermin" in str(failed.value.cause).lower(), failed.value.cause
    events = [e.event_type async for e in handle.fetch_history_events()]
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    # it failed on its first replay: no workflow task was retried before
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
