"""A tool_use the policy generated, through the Anthropic Messages API and back, spliced exactly: real
services on the session's script-model stack (tests/fixtures/agents_script.py: its Temporal dev server,
a vLLM engine on the script model, which answers this module's request with a well-formed hermes tool
call, tests/gateway/weather_call.py; the gateway and an in-process grove worker), because the session's
main worker serves the tiny-random model, which never writes one.

What each call was is read from the engine (`RecordingEngine.served`), what the episode admitted from
the workflow, and the row from the closed episode's parquet.
"""

from __future__ import annotations

import json
import re

import anthropic
import numpy as np
import pytest
from transformers import AutoTokenizer

from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from grove import queues
from grove.contracts import EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.fixtures.agents_script import AgentsScriptStack
from tests.gateway.test_app_e2e import MODEL, SECRET, close
from tests.gateway.weather_call import ASKED, CALL, WEATHER
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


async def start_episode(client, name: str) -> str:
    """An external episode with a fixed id (so fixed sampling seeds)."""
    run = f"at-{name}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=64),
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


def claude(url: str, episode_id: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{url}/episodes/{episode_ref(episode_id)}",
        api_key=issue_token(SECRET, episode_id),
        max_retries=0,
    )


async def test_a_generated_tool_use_comes_back_as_generated_and_its_result_continues_exactly(
    agents_script_stack: AgentsScriptStack,
):
    stack = agents_script_stack
    client, engine, store, url = stack.client, stack.engine, stack.store, stack.url
    asked = ASKED
    eid = await start_episode(client, "tool")
    async with claude(url, eid).messages.stream(
        model=MODEL, max_tokens=64, messages=asked, tools=[WEATHER], extra_body={"temperature": 0.7}
    ) as stream:
        first = await stream.get_final_message()
    assert first.stop_reason == "tool_use", first.content
    served = engine.calls_of(eid)["parent.0.c0"]
    [tool_use] = [b for b in first.content if b.type == "tool_use"]
    assert (tool_use.name, tool_use.input) == (CALL["name"], CALL["arguments"])  # the model's script
    # what the engine sampled, decoded here: its tool-call block carries this name and these arguments
    tokenizer = AutoTokenizer.from_pretrained(str(stack.model))
    completion = tokenizer.decode(served.completion_ids.tolist())
    block = json.loads(re.search(r"<tool_call>(.*?)</tool_call>", completion, re.DOTALL).group(1))
    assert (block["name"], block["arguments"]) == (tool_use.name, tool_use.input)
    assert first.usage.output_tokens == served.completion_ids.size

    # The harness runs the tool and re-sends the turn: tool_use as it got it (input re-serialised by the
    # SDK), then its result. The policy's generated tokens are spliced: the next prompt extends them.
    turn = [
        *asked,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}],
        },
    ]
    second = await claude(url, eid).messages.create(
        model=MODEL, max_tokens=16, messages=turn, tools=[WEATHER]
    )
    calls = engine.calls_of(eid)
    parent, child = calls["parent.0.c0"], calls["parent.0.c1"]
    prefix = np.concatenate([parent.prompt_ids, parent.completion_ids])
    assert np.array_equal(child.prompt_ids[: prefix.size], prefix) and child.prompt_ids.size > prefix.size
    assert second.usage.input_tokens == child.prompt_ids.size

    r = await close(url, eid, {"final_answer": "sunny"}, wait=True)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2}
    [row] = rows_from_parquet(store.get(result["rows_key"]))
    np.testing.assert_array_equal(row.input_ids, np.concatenate([child.prompt_ids, child.completion_ids]))
