"""Claim check (DESIGN.md section 10): a chat request's messages live in the object store; the `call`
Update and the `generate` activity's input carry a key and a digest, so a megabyte request does not
grow the episode's history by megabytes (issue 12: fourteen 1.9 MB requests terminated an episode).

Through the gateway's capture path (gateway/capture.py) on the real stack: Temporal dev server, grove
worker with vLLM on the tiny-random model, local object store.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from gateway.capture import Capture
from gateway.chat_request import ChatCompletionRequest
from gateway.episodes import Episodes, EpisodeUpdateRejectedError
from grove.contracts import CloseRequest, GenerateInput
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.durability.helpers import decoded_inputs
from tests.episodes.kit import episode_spec, start
from trainer.staging_format import staging_prefix

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
