"""The inference worker on a real Temporal dev server: payloads as pydantic models, typed failures."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.inference_worker import DataConverterError, build_inference_worker
from grove import queues
from grove.contracts import GenerateInput, GenerateResult, PromptSpec
from grove.sampling import SamplingConfig
from grove.staging_format import decode_call_tokens

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM


class GenerateOnceInput(BaseModel):
    # A queue of its own: the session's grove worker may already poll grove.queues.INFERENCE in this
    # process, and Temporal allows one worker per task queue per process.
    queue: str
    generate: GenerateInput


@workflow.defn(sandboxed=False)
class GenerateOnce:
    """The smallest caller of the activity: what EpisodeWorkflow does per call."""

    @workflow.run
    async def run(self, inp: GenerateOnceInput) -> GenerateResult:
        return await workflow.execute_activity(
            "generate", inp.generate, task_queue=inp.queue, start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=20), retry_policy=RetryPolicy(maximum_attempts=1),
            result_type=GenerateResult,
        )  # fmt: skip


async def test_generate_through_a_real_worker(temporal_client, policy_engine, store, tmp_path):
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    inference_queue = f"{queues.INFERENCE}-{uuid.uuid4().hex[:8]}"
    inference = build_inference_worker(
        temporal_client, policy_engine, store, weights_root=tmp_path / "w", task_queue=inference_queue
    )
    caller = Worker(temporal_client, task_queue=queue, workflows=[GenerateOnce])
    ok = GenerateInput(
        episode_id="ep-w",
        call_id="c0",
        prompt=PromptSpec(ids=[1, 5, 6]),
        sampling=SamplingConfig(max_tokens=8),
    )
    bad = GenerateInput(episode_id="ep-w", call_id="c1", prompt=PromptSpec(), sampling=SamplingConfig())
    async with inference, caller:
        result = await temporal_client.execute_workflow(
            GenerateOnce.run,
            GenerateOnceInput(queue=inference_queue, generate=ok),
            id=f"gen-{uuid.uuid4()}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as err:
            await temporal_client.execute_workflow(
                GenerateOnce.run,
                GenerateOnceInput(queue=inference_queue, generate=bad),
                id=f"gen-{uuid.uuid4()}",
                task_queue=queue,
            )

    assert isinstance(result, GenerateResult) and result.policy_version == policy_engine.version
    staged = decode_call_tokens(store.get(result.staging_key))
    assert staged.prompt_ids.tolist() == [1, 5, 6] and staged.completion_ids.tolist() == result.completion_ids
    cause = err.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert cause.cause.type == "PromptSpecError" and cause.cause.non_retryable


async def test_worker_refuses_a_client_without_the_pydantic_converter(temporal_server, policy_engine, store):
    plain = await Client.connect(temporal_server.address)
    with pytest.raises(DataConverterError, match="grove.client.connect"):
        build_inference_worker(plain, policy_engine, store)
