"""Claim check (docs/design.md section 8): a chat request's messages live in the object store; the `call`
Update and the `generate` activity's input carry a key and a digest, so a megabyte request does not
grow the episode's history by megabytes (inline, each request lands in the history twice, and Temporal
terminates an episode whose history passes its size limit).

Through the gateway's capture path (gateway/pipeline/capture.py) on the real stack: Temporal dev server, grove
worker with vLLM on the tiny-random model, local object store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel
from temporalio.client import Client

from gateway.intake.chat_request import ChatCompletionRequest
from gateway.pipeline.capture import Capture
from gateway.temporal.episode_client import Episodes, EpisodeUpdateRejectedError
from grove import queues
from grove.contracts import COMPLETION_INLINE_MAX, CloseRequest, EpisodeResult, GenerateInput, HarnessSpec
from grove.sampling import SamplingConfig
from grove.store_layout import staging_prefix
from harnesses import delegation, scenario
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT
from tests.durability.helpers import decoded_inputs
from tests.episodes.kit import ROOT, call_request, episode_spec, start

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

BIG = 1_900_000  # bytes of message text: the size of the requests that terminated an episode
PER_CALL_LIMIT = 32_000  # history bytes one call may add, whatever its request's size


async def _history_bytes(client: Client, episode_id: str) -> int:
    history = await client.get_workflow_handle(episode_id).fetch_history()
    return sum(e.ByteSize() for e in history.events)


def _request(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="grove-tiny", messages=[{"role": "user", "content": text}])


async def test_a_megabyte_request_adds_kilobytes_of_history(temporal_client: Client, grove_worker, e2e_store):
    episodes = Episodes(temporal_client)
    capture = Capture(episodes, e2e_store)
    episode_id = await start(temporal_client, episode_spec("claim"))
    await capture.chat(episode_id, _request("Hello."), {})
    before = await _history_bytes(temporal_client, episode_id)
    big = _request("many words " * (BIG // 11))
    assert len(big.model_dump_json()) > BIG
    # Far longer than the tiny model's context: the call fails in generation, after admission.
    with pytest.raises(EpisodeUpdateRejectedError) as failed:
        await capture.chat(episode_id, big, {"x-grove-agent": "reader"})
    assert failed.value.error_type == "GenerationFailed" and "PromptTooLong" in str(failed.value)
    grown = await _history_bytes(temporal_client, episode_id) - before
    assert 0 < grown < PER_CALL_LIMIT, grown
    handle = temporal_client.get_workflow_handle(episode_id)
    inputs = await decoded_inputs(temporal_client, handle, "generate", GenerateInput)
    assert all(i.prompt.chat is None and i.prompt.chat_ref is not None for i in inputs)
    await capture.chat(episode_id, _request("Hello again."), {"x-grove-agent": "other"})
    await episodes.close(episode_id, CloseRequest(final_answer="done"))
    result = await asyncio.wait_for(episodes.result(episode_id), 120)
    assert result.status == "ok" and result.counts == {"selected": 2, "failed": 1}, result
    assert e2e_store.list(staging_prefix(episode_id)) == []  # the stored requests went with the staging
    print(f"\nhistory growth of one {BIG / 1e6:.1f} MB request: {grown} B")


class CallResultOfBefore(BaseModel):
    """The `call` Update's result as a gateway of before the claim check (46953bc^) decodes it: the
    completion inline, required (pydantic's default: unknown fields ignored)."""

    call_id: str
    completion_ids: list[int]
    text: str
    assistant_message: dict[str, Any]
    finish_reason: str
    policy_version: int
    staging_key: str


LONG = 400  # tokens (ignore_eos): a completion whose inline form is over COMPLETION_INLINE_MAX


async def test_a_caller_of_before_the_claim_check_gets_a_long_completion_inline(
    temporal_client: Client, grove_worker
):
    """Rolling deploy: a gateway of an earlier version sends no `completion_by_ref`, so a newer episode
    worker returns even a long completion inline, which that gateway decodes; one that asks (today's
    gateway) gets a reference for the same size."""
    spec = episode_spec("ref-compat").model_copy(
        update={"sampling": SamplingConfig(max_tokens=LONG, ignore_eos=True)}
    )
    episode_id = await start(temporal_client, spec)
    handle = temporal_client.get_workflow_handle(episode_id)
    await handle.execute_update("open_context", ROOT)
    # the request as the earlier gateway sends it (without the field); the result as it crossed (no result
    # type), decoded by what that gateway knew
    request = call_request(episode_id, 0).model_dump(exclude={"completion_by_ref"})
    old = CallResultOfBefore.model_validate(await handle.execute_update("call", request))
    assert len(old.completion_ids) == LONG and old.text
    inline = len(old.model_dump_json(include={"completion_ids", "text", "assistant_message"}))
    assert inline > COMPLETION_INLINE_MAX, inline  # the size that goes by reference when asked
    asked = call_request(episode_id, 1).model_copy(update={"completion_by_ref": True})
    new = await handle.execute_update("call", asked)
    assert new["completion_ref"] and new.get("completion_ids") is None and new.get("text") is None
    episodes = Episodes(temporal_client)
    await episodes.close(episode_id, CloseRequest(final_answer="done"))
    result = await asyncio.wait_for(episodes.result(episode_id), RESULT_WAIT)
    assert result.status == "ok" and result.counts == {"selected": 2}, result


async def test_a_long_native_conversation_sends_each_call_only_its_new_messages(
    temporal_client: Client, grove_worker, recording_engine
):
    """A native program's continuation names its parent's stored Conversation (ChatDelta) instead of
    carrying the conversation (and its parent's messages) again: each call's `generate` input stays the
    same size while the conversation grows, and the calls are still one token-exact chain (one row)."""
    spec = episode_spec("native-long").model_copy(
        update={"harness": HarnessSpec(program=scenario.LONG_NAME), "sampling": SamplingConfig(max_tokens=8)}
    )
    result = await temporal_client.execute_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    turns = scenario.LONG_TURNS
    assert result.status == "ok" and result.counts == {"selected": turns} and result.num_rows == 1, result
    handle = temporal_client.get_workflow_handle(spec.episode_id)
    inputs = await decoded_inputs(temporal_client, handle, "generate", GenerateInput)
    assert len(inputs) == turns and inputs[0].prompt.chat is not None
    deltas = [i.prompt.chat_delta for i in inputs[1:]]
    assert all(d is not None and len(d.messages) == 1 for d in deltas)
    sizes = [len(i.model_dump_json()) for i in inputs[1:]]
    conversation = [d.parent_conversation.size for d in deltas]  # what each call's prompt stands on
    served = recording_engine.calls_of(spec.episode_id)
    print(
        f"\nnative conversation of {turns} calls: generate input {sizes[0]}..{sizes[-1]} B per call while "
        f"the parent conversation grew {conversation[0]}..{conversation[-1]} B (inline, each call carried "
        f"it and its parent's messages); last prompt {served[inputs[-1].call_id].prompt_ids.size} tokens"
    )
    assert conversation[-1] > 4 * conversation[0]
    assert max(sizes) - min(sizes) < 64  # digits of ids and turn numbers, not the conversation
    # token-exact: each call's prompt is its parent's prompt + completion + the new turn
    for parent, child in zip(inputs, inputs[1:], strict=False):
        p, c = served[parent.call_id], served[child.call_id]
        head = np.concatenate([p.prompt_ids, p.completion_ids])
        np.testing.assert_array_equal(c.prompt_ids[: head.size], head)


async def test_the_native_delegation_demo_continues_its_parent_by_delta(
    temporal_client: Client, grove_worker
):
    """The demo's parent resumes after its workers' answers: that call carries the two tool results and a
    reference, not the parent's first turn again; the workers' roots carry their own short chats."""
    spec = episode_spec("native-delegation").model_copy(
        update={
            "task": delegation.make_task(0),
            "harness": HarnessSpec(program=delegation.FAMILY),
            "sampling": SamplingConfig(max_tokens=32),
        }
    )
    result = await temporal_client.execute_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    assert result.status == "ok" and result.counts == {"selected": 4}, result
    handle = temporal_client.get_workflow_handle(spec.episode_id)
    inputs = {i.call_id: i for i in await decoded_inputs(temporal_client, handle, "generate", GenerateInput)}
    print(
        "\nnative delegation demo, generate input per call:",
        {k: len(i.model_dump_json()) for k, i in inputs.items()},
    )
    resumed = inputs["parent.0.c1"].prompt
    assert resumed.chat is None and [m["role"] for m in resumed.chat_delta.messages] == ["tool", "tool"]
    assert all(inputs[c].prompt.chat is not None for c in ("parent.0.c0", "worker-1.0.c0", "worker-2.0.c0"))
