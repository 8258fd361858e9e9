"""Episodes whose workflow tasks cannot succeed end instead of stalling their step until the run's bound;
the run then counts them as infrastructure failures (tests/e2e/test_group_outcomes.py covers that half).

- Nondeterminism fails the episode at once (workflows/episode.py, EPISODE_FAILURE_TYPES).
- Any other failure on every attempt (the dev server's unreplayable histories fail with the SDK core's
  `Fatal error in workflow machines`) is ended by the episodes worker's sweep once the server flags it
  (activities/wedged_episodes.py).

Both are made the way they happen in production, on a real dev server: a worker runs the episode's first
workflow task and goes away; the next worker to pick the episode up has no cached state and replays the
history with code that no longer fits it.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.wedged_episodes import PROBLEMS, end_wedged, find_wedged, sweep_forever, wedged_query
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from ledger.handover import EpisodeRun
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from workflows.episode import EpisodeWorkflow
from workflows.training_run import RUN

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)
FAILED = "category=WorkflowTaskFailed"

# the episode's own failure types, whatever they are: the drifted copy differs from it only in its code
EPISODE_DEFINITION = workflow._Definition.must_from_class(EpisodeWorkflow)


@workflow.defn(name="EpisodeWorkflow", failure_exception_types=EPISODE_DEFINITION.failure_exception_types)
class DriftedEpisode(EpisodeWorkflow):
    """The episode with one command more at its start: what a worker running changed code replays."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(spec)


@workflow.defn(name="EpisodeWorkflow")
class BrokenEpisode(EpisodeWorkflow):
    """The episode with code that raises on its first workflow task: every attempt fails, as the tasks of
    an unreplayable history do."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        raise RuntimeError("this episode's workflow task fails on every attempt")


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


def external_spec(run: str, index: int) -> EpisodeSpec:
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g{index}",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8),
    )  # fmt: skip


async def until_flagged(client: Client, run: str) -> None:
    """Until the server flags the run's episode for failed workflow tasks (a state that stays while the
    broken worker runs: the flag clears only on a successful task)."""
    deadline = asyncio.get_running_loop().time() + STATE_WAIT
    while True:
        flagged = [e async for e in client.list_workflows(wedged_query(run))]
        if any(FAILED in (e.search_attributes or {}).get(PROBLEMS, []) for e in flagged):
            return
        assert asyncio.get_running_loop().time() < deadline, (
            f"no episode of {run} flagged in {STATE_WAIT:.0f} s"
        )
        await asyncio.sleep(0.5)


async def until_found(client: Client, run: str) -> list:
    """find_wedged on the run's episodes until it finds one (its task is sure to keep failing)."""
    deadline = asyncio.get_running_loop().time() + STATE_WAIT
    while not (found := await find_wedged(client, grove_run=run)):
        assert asyncio.get_running_loop().time() < deadline, f"nothing of {run} found in {STATE_WAIT:.0f} s"
        await asyncio.sleep(0.5)
    return found


async def until_closed(handle: WorkflowHandle) -> None:
    deadline = asyncio.get_running_loop().time() + STATE_WAIT
    while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        assert asyncio.get_running_loop().time() < deadline, (
            f"{handle.id} still running after {STATE_WAIT:.0f} s"
        )
        await asyncio.sleep(0.2)


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_the_sweep_ends_an_episode_whose_task_fails_on_every_attempt_and_no_other(temporal_client):
    queue = f"wedge-{uuid.uuid4().hex[:8]}"
    run = f"wedge-{uuid.uuid4().hex[:6]}"
    marks = TypedSearchAttributes([SearchAttributePair(RUN, run)])
    handles = []
    async with worker(temporal_client, queue, EpisodeWorkflow):
        for i in range(2):
            spec = external_spec(run, i)
            handles.append(
                await temporal_client.start_workflow(
                    EpisodeWorkflow.run, spec, id=spec.episode_id, task_queue=queue, search_attributes=marks
                )
            )
        for handle in handles:
            await first_task_completed(handle)
    wedged, healthy = handles
    try:
        async with worker(temporal_client, queue, BrokenEpisode):
            await wedged.cancel()  # a new workflow task for one episode only: its replay fails, every time
            await until_flagged(temporal_client, run)
            (found,) = await until_found(temporal_client, run)  # only the failing one
            assert found.episode_id == wedged.id and found.attempt >= 3
            assert any("WorkflowTaskFailed" in p for p in found.problems)
            sweep = asyncio.create_task(
                sweep_forever(temporal_client, every_s=0.2)
            )  # what `grove worker` runs
            try:
                await until_closed(wedged)
            finally:
                sweep.cancel()
        assert (await wedged.describe()).status == WorkflowExecutionStatus.TERMINATED
        last = [e async for e in wedged.fetch_history_events()][-1]
        reason = last.workflow_execution_terminated_event_attributes.reason
        assert "times in a row" in reason and "WorkflowTaskFailed" in reason, reason
        assert (await healthy.describe()).status == WorkflowExecutionStatus.RUNNING  # never touched
        assert await end_wedged(temporal_client, grove_run=run) == []  # nothing left to end
    finally:
        await healthy.terminate(reason="test over")
