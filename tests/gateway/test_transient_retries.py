"""Transient answers of Temporal are asked again within a bound, on every query and Update the gateway
makes (gateway/retry_policy.py); answers about the request are not.

Under a worker SIGKILL, 1 of 6 concurrent requests got 503 ("the summary query: Temporal answered
CANCELLED") instead of being served once another worker took the episode. On a real dev server, a query
to a workflow no worker serves is answered CANCELLED ("Timeout expired") when its wait ends: here the
gateway's query is asked with a 1 s wait while no worker polls, and is answered once the test starts one
after the first CANCELLED (a moment the test makes: it waits for the gateway's retry count, a state that
stays). The Update path and the policy itself are driven with the errors exactly as the Temporal client
raises them.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from gateway.episodes import EpisodeNotFoundError, Episodes, TemporalUnavailableError
from gateway.retry_policy import transient_retries
from tests.bounds import STATE_WAIT


def rpc(status: RPCStatusCode, message: str = "Timeout expired") -> RPCError:
    return RPCError(message, status, b"")


def failing(*errors: BaseException, answer: str = "answered"):
    """A call that raises `errors` one per attempt, then answers; `attempts` counts them."""
    attempts: list[int] = []

    async def call() -> str:
        attempts.append(len(attempts))
        if len(attempts) <= len(errors):
            raise errors[len(attempts) - 1]
        return answer

    return call, attempts


@pytest.mark.parametrize(
    "status",
    [
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    ],
)
async def test_transient_answers_are_asked_again_until_answered(status):
    call, attempts = failing(rpc(status), rpc(status))
    assert await transient_retries(call) == "answered" and len(attempts) == 3


async def test_an_answer_about_the_request_is_not_asked_again():
    call, attempts = failing(rpc(RPCStatusCode.NOT_FOUND, "workflow not found"))
    with pytest.raises(RPCError):
        await transient_retries(call)
    assert len(attempts) == 1


async def test_past_the_bound_the_last_transient_answer_is_raised():
    call, attempts = failing(*[rpc(RPCStatusCode.UNAVAILABLE)] * 50)
    with pytest.raises(RPCError) as err:
        await transient_retries(call, patience=0.2)
    assert err.value.status == RPCStatusCode.UNAVAILABLE and 2 <= len(attempts) < 50


async def test_an_update_answered_unavailable_is_sent_again_with_its_id():
    call, attempts = failing(rpc(RPCStatusCode.UNAVAILABLE, "connection reset"), answer="admitted")
    episodes = Episodes(client=None)
    assert await episodes._through_handover("ep-1", "call parent.0.c1", call) == "admitted"
    assert len(attempts) == 2 and episodes.transient_retries == 1


async def test_a_query_past_its_bound_is_a_503_naming_the_status():
    episodes = Episodes(client=None)
    episodes.transient_patience = 0.2
    call, _ = failing(*[rpc(RPCStatusCode.CANCELLED)] * 10_000)
    with pytest.raises(TemporalUnavailableError, match="CANCELLED"):
        await episodes._ask("ep-1", "the context_view query", call)
    not_found, _ = failing(rpc(RPCStatusCode.NOT_FOUND, "workflow not found"))
    with pytest.raises(EpisodeNotFoundError):
        await episodes._ask("ep-1", "the context_view query", not_found)


@workflow.defn(name="QueriedWorkflow")
class QueriedWorkflow:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query(name="call_states")
    def call_states(self, call_ids: list[str]) -> dict[str, str]:
        return dict.fromkeys(call_ids, "completed")


async def test_a_query_no_worker_answers_yet_is_asked_again_until_one_does(temporal_client):
    queue, wid = f"q-{uuid.uuid4().hex[:8]}", f"queried-{uuid.uuid4().hex[:8]}"
    handle = await temporal_client.start_workflow("QueriedWorkflow", id=wid, task_queue=queue)
    episodes = Episodes(temporal_client, query_timeout=timedelta(seconds=1))
    asking = asyncio.create_task(episodes.call_states(wid, ["parent.0.c0"]))
    async with asyncio.timeout(STATE_WAIT):
        while episodes.transient_retries == 0:  # Temporal answered CANCELLED: no worker polls the queue
            assert not asking.done(), asking.exception()
            await asyncio.sleep(0.05)
    async with Worker(temporal_client, task_queue=queue, workflows=[QueriedWorkflow]):
        assert await asking == {"parent.0.c0": "completed"}
        await handle.terminate("test done")


async def test_an_episode_worker_of_before_delivery_in_the_ledger_is_not_asked_twice(temporal_client):
    """A rolling deploy: a newer gateway, an older episode worker without the `deliver` Update (its calls
    count as delivered on completion). Its refusal ("handler not found") is not a refusal of the response:
    the gateway sends it; any other refusal is raised."""
    queue, wid = f"q-{uuid.uuid4().hex[:8]}", f"older-{uuid.uuid4().hex[:8]}"
    handle = await temporal_client.start_workflow("QueriedWorkflow", id=wid, task_queue=queue)
    async with Worker(temporal_client, task_queue=queue, workflows=[QueriedWorkflow]):
        await Episodes(temporal_client).deliver(wid, "parent.0.c0")
        await handle.terminate("test done")
