"""The real Temporal dev server runs a workflow with one activity, persists across a restart, and
knows grove's search attributes."""

from __future__ import annotations

import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from grove.client import connect
from infra.temporal import SEARCH_ATTRIBUTES, TemporalDevServer
from infra.worker_process import wait_until
from tests.bounds import STATE_WAIT


class ShoutInput(BaseModel):
    text: str
    times: int


class ShoutResult(BaseModel):
    text: str
    activity_attempts: int


@activity.defn
async def shout(inp: ShoutInput) -> ShoutResult:
    return ShoutResult(text=(inp.text.upper() + "!") * inp.times, activity_attempts=activity.info().attempt)


@workflow.defn
class ShoutWorkflow:
    @workflow.run
    async def run(self, inp: ShoutInput) -> ShoutResult:
        return await workflow.execute_activity(shout, inp, start_to_close_timeout=timedelta(seconds=10))


async def test_workflow_with_one_activity_runs_on_the_dev_server(temporal_client):
    queue = f"smoke-{uuid.uuid4()}"
    async with Worker(temporal_client, task_queue=queue, workflows=[ShoutWorkflow], activities=[shout]):
        result = await temporal_client.execute_workflow(
            ShoutWorkflow.run, ShoutInput(text="grove", times=2), id=f"smoke-{uuid.uuid4()}", task_queue=queue
        )
    assert result == ShoutResult(text="GROVE!GROVE!", activity_attempts=1)


async def test_grove_search_attributes_are_registered_and_queryable(temporal_client):
    queue = f"smoke-{uuid.uuid4()}"
    run_key = SearchAttributeKey.for_keyword("GroveRun")
    step_key = SearchAttributeKey.for_int("GroveStep")
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with Worker(temporal_client, task_queue=queue, workflows=[ShoutWorkflow], activities=[shout]):
        await temporal_client.execute_workflow(
            ShoutWorkflow.run,
            ShoutInput(text="x", times=1),
            id=f"smoke-{uuid.uuid4()}",
            task_queue=queue,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(run_key, run_id), SearchAttributePair(step_key, 7)]
            ),
        )
    # Visibility is eventually consistent on the dev server: poll until the finished workflow is listed (it
    # stays listed once it is), bounded as every state wait (tests/bounds.py) - the visibility update lags
    # more the more loaded the machine is (the bound was 5 s); a read the loaded server drops is asked
    # again (wait_until).

    async def listed() -> list:
        return [w async for w in temporal_client.list_workflows(f"GroveRun = '{run_id}' AND GroveStep = 7")]

    found = await wait_until(listed, STATE_WAIT, f"workflow of run {run_id} listed by its search attributes")
    assert len(found) == 1
    assert set(SEARCH_ATTRIBUTES) >= {"GroveRun", "GroveStep", "GroveStatus"}


async def test_completed_workflow_survives_a_server_restart_on_the_same_database(tmp_path):
    server = TemporalDevServer(tmp_path).start()
    wf_id = f"persist-{uuid.uuid4()}"
    queue = f"smoke-{uuid.uuid4()}"
    try:
        client = await connect(server.address)
        async with Worker(client, task_queue=queue, workflows=[ShoutWorkflow], activities=[shout]):
            await client.execute_workflow(
                ShoutWorkflow.run, ShoutInput(text="keep", times=1), id=wf_id, task_queue=queue
            )
        server.kill()  # SIGKILL: no clean shutdown
        server.start()
        client = await connect(server.address)
        result = await client.get_workflow_handle(wf_id, result_type=ShoutResult).result()
        assert result.text == "KEEP!"
    finally:
        server.stop()
    assert server.proc is None
