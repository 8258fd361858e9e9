"""The harness runner on real services: stock OpenCode (npm opencode-ai, pinned) launched per episode by
the `run_harness` activity, talking to the real gateway, Temporal dev server and vLLM on the tiny model.

What the engine served is read from the engine itself (RecordingEngine), never from grove's records.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from temporalio.api.enums.v1 import PendingActivityState

from grove.contracts import EpisodeResult, HarnessHeartbeat, OpenCodeOptions
from harnesses.opencode_install import opencode_binary
from tests.harnesses.opencode_kit import (
    launch_events,
    opencode_spec,
    opencode_stack,
    run_episode,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
async def stack(temporal_client, temporal_server, tiny_trained_model_dir, tmp_path_factory):
    await asyncio.to_thread(opencode_binary)  # installs the pinned OpenCode on a fresh machine
    async with opencode_stack(
        temporal_client, temporal_server, tiny_trained_model_dir, tmp_path_factory.mktemp("oc")
    ) as s:
        yield s


async def test_runner_launches_opencode_and_closes_the_episode(stack, tiny_tokenizer):
    spec = opencode_spec("run")
    result = await run_episode(stack.client, spec)
    assert result.status == "ok", result.failure
    served = stack.engine.calls_of(spec.episode_id)
    assert sorted(served) == ["parent.0.c0"]  # the lead's one turn (title agent off, no task call)
    call = served["parent.0.c0"]
    prompt = tiny_tokenizer.decode(call.prompt_ids)
    assert "Words:\n" + "\n".join(spec.task.params["words"]) in prompt  # the family's first message
    assert '"name": "task"' in prompt  # the lead's only tool reached the template
    # The final answer the runner extracted is the text OpenCode printed: the served completion's.
    events = launch_events(stack.harness_root, spec.episode_id)
    texts = [e["part"]["text"] for e in events if e["type"] == "text"]
    completion = tiny_tokenizer.decode(call.completion_ids, skip_special_tokens=True)
    assert texts and texts[-1].strip() == completion.strip()
    assert result.counts == {"selected": 1}
    [row] = rows_from_parquet(stack.store.get(result.rows_key))
    assert list(row.input_ids) == [*call.prompt_ids, *call.completion_ids]


async def test_heartbeat_shows_process_calls_and_last_request(stack):
    """Held mid-call by a gate: the pending run_harness activity's heartbeat names the live OpenCode
    process, the calls admitted so far and the time of the last request."""
    spec = opencode_spec("beat")
    stack.gates.arm("generate", f"^{spec.episode_id}/parent")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await _until(lambda: stack.gates.held("generate"), "the lead's call held in the engine")
        beat = await _until_heartbeat(handle, lambda b: b.calls >= 1)
        assert beat.launch == 1 and beat.pid is not None
        os.kill(beat.pid, 0)  # the OpenCode process is alive (raises if not)
        assert beat.last_request is not None and beat.elapsed_s > 0
    finally:
        stack.gates.disarm("generate")
    result = await asyncio.wait_for(handle.result(), 300)
    assert result.status == "ok", result.failure


async def test_an_over_long_prompt_is_refused_before_admission(stack):
    """OpenCode's default `build` agent sends ~15,000 tokens: the gateway answers 400
    context_length_exceeded before anything is admitted, so no call of the agent is ever generated;
    OpenCode then tries to compact (its reaction to that error), and the episode ends failed."""
    options = OpenCodeOptions(agents={"title": {"disable": True}}, default_agent="build")
    spec = opencode_spec("long", opencode=options, deadline_s=60)
    result = await run_episode(stack.client, spec)
    assert result.status == "failed", result
    served = stack.engine.calls_of(spec.episode_id)
    assert all("~" in call for call in served), served  # only auxiliary (summary) calls ran, if any
    print(f"over-long episode: failure={result.failure!r}; auxiliary calls served: {sorted(served)}")


async def _until(probe, what: str, timeout: float = 120):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if probe():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def _until_heartbeat(handle, accept, timeout: float = 120) -> HarnessHeartbeat:
    from temporalio.converter import DataConverter

    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        desc = await handle.describe()
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name != "run_harness" or not pending.heartbeat_details.payloads:
                continue
            assert pending.state in (PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,)
            [raw] = await DataConverter.default.decode(pending.heartbeat_details.payloads, [dict])
            beat = HarnessHeartbeat.model_validate(raw)
            if accept(beat):
                return beat
        await asyncio.sleep(0.5)
    raise AssertionError("no heartbeat of run_harness with the expected details")
