"""Transient answers of Temporal are asked again within a bound, on every query and Update the gateway
makes (gateway/temporal/retry_policy.py); answers about the request are not.

A request whose episode's worker is SIGKILLed must be served once another worker takes the episode, not
answered 503 ("the context_view query: Temporal answered CANCELLED"). On a real dev server, a query
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
from temporalio.client import Client, Interceptor, OutboundInterceptor, StartWorkflowUpdateInput
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from gateway.temporal.episode_client import (
    EpisodeNotFoundError,
    Episodes,
    EpisodeUpdateRejectedError,
    TemporalUnavailableError,
)
from gateway.temporal.retry_policy import transient_retries
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


class UpdatesSent(Interceptor):
    """A client interceptor that records the name of every Update the client sends (real client, real
    server: this only counts what passes through)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        sent = self.names

        class Counting(OutboundInterceptor):
            async def start_workflow_update(self, input: StartWorkflowUpdateInput):
                sent.append(input.update)
                return await super().start_workflow_update(input)

        return Counting(next)


def counting_client(client: Client) -> tuple[Client, list[str]]:
    """A client on `client`'s connection whose Updates are recorded."""
    counter = UpdatesSent()
    config = client.config()
    config["interceptors"] = [*config["interceptors"], counter]
    return Client(**config), counter.names


@workflow.defn(name="RefusingDeliverWorkflow")
class RefusingDeliverWorkflow:
    """A worker that has the `deliver` Update and refuses it (as the ledger refuses an undeliverable call)."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update(name="deliver")
    def deliver(self, call_id: str) -> None:
        return None

    @deliver.validator
    def refuse(self, call_id: str) -> None:
        raise ApplicationError(f"call {call_id!r} cannot be delivered", type="UndeliverableCallError")


async def test_an_episode_worker_of_before_delivery_in_the_ledger_is_not_asked_twice(temporal_client):
    """A rolling deploy: a newer gateway, an older episode worker without the `deliver` Update (its calls
    count as delivered on completion). Its refusal ("handler not found") is not a refusal of the response:
    the gateway asks once, takes the answer as nothing to record and returns (the response is sent); it
    neither raises nor sends the Update again."""
    client, updates = counting_client(temporal_client)
    queue, wid = f"q-{uuid.uuid4().hex[:8]}", f"older-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow("QueriedWorkflow", id=wid, task_queue=queue)
    episodes = Episodes(client)
    async with Worker(client, task_queue=queue, workflows=[QueriedWorkflow]):
        assert await episodes.deliver(wid, "parent.0.c0") is None
        await handle.terminate("test done")
    assert updates == ["deliver"]  # asked once: the refusal is an answer, not a moment to wait out
    assert episodes.transient_retries == 0 and episodes.outcome_waits == 0


async def test_any_other_refusal_of_deliver_is_raised_after_one_ask(temporal_client):
    """The older-worker exception is that refusal only: a worker that has `deliver` and refuses the call
    makes the gateway raise (the response must not be sent as delivered), also after one ask."""
    client, updates = counting_client(temporal_client)
    queue, wid = f"q-{uuid.uuid4().hex[:8]}", f"refusing-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow("RefusingDeliverWorkflow", id=wid, task_queue=queue)
    async with Worker(client, task_queue=queue, workflows=[RefusingDeliverWorkflow]):
        with pytest.raises(EpisodeUpdateRejectedError, match="cannot be delivered") as err:
            await Episodes(client).deliver(wid, "parent.0.c0")
        await handle.terminate("test done")
    assert err.value.error_type == "UndeliverableCallError"
    assert updates == ["deliver"]
