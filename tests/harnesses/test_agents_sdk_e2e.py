"""The OpenAI Agents SDK on real services: grove's ModelProvider against the real gateway (uvicorn), the
Temporal dev server and a grove worker with a real vLLM engine on the tiny model; and the same provider
behind Temporal's official integration (temporalio.contrib.openai_agents), with a real activity retry.

The tiny model never writes a parseable tool call, so the lead's delegation is driven by the test: the
worker tool is invoked as the SDK invokes it (`on_invoke_tool` with a ToolContext whose tool call is an
item of the lead's real response). Every model call is a real engine call.

Handoffs need a model that writes the handoff call: those tests run on the session's grove whose engine
serves the Agents SDK script model (tests/fixtures/agents_script.py), with `Runner.run` in this process
and inside a Temporal workflow (temporalio.contrib.openai_agents); the streamed form is in
test_agents_sdk_stream_e2e.py. The agent a handoff transfers to must be recorded as spawned by the call
that handed off, with nothing declared by the program.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from agents import Agent, Runner, function_tool
from agents.run_config import CallModelData, ModelInputData
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall
from temporalio import activity
from temporalio.common import RetryPolicy
from temporalio.contrib.openai_agents import ModelActivityParameters

from grove.receipts import CallState, ContextOrigin
from harnesses.clients.agents_sdk import GroveModelProvider
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.fixtures.agents_script import AgentsScriptStack
from tests.gateway.test_app_e2e import (  # noqa: F401  (gateway_url is a fixture)
    MODEL,
    contexts,
    extension_of,
    gateway_url,
    start_episode,
    summary,
)
from tests.harnesses.agents_handoff_kit import FRONT, check_hand_back_episode, check_handoff_episode
from tests.harnesses.agents_handoff_workflow import HandoffWorkflow
from tests.harnesses.agents_stream_model import CARRY_USER, ROUTE_USER, concierge, front_desk, script_settings
from tests.harnesses.framework_kit import (
    bind,
    external_episode,
    nonzero,
    published_rows,
    rows_as_served,
    run_agents_workflow,
)
from tests.harnesses.opencode_kit import response_text

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from agents_sdk_temporal import LeadWorkflow, lead_agent  # noqa: E402

LEAD = "Lead-agent"  # the example's root agent, "Lead agent", under its own name


def tool_context(tool, call_id: str, spawning_item_id: str, topic: str, lead, run_config) -> ToolContext:
    arguments = f'{{"input": "{topic}"}}'
    call = ResponseFunctionToolCall(
        id=spawning_item_id, call_id=call_id, name=tool.name, arguments=arguments, type="function_call"
    )
    return ToolContext(
        context=None,
        tool_name=tool.name,
        tool_call_id=call_id,
        tool_arguments=arguments,
        tool_call=call,
        agent=lead,
        run_config=run_config,
    )


async def test_provider_names_agents_and_spawns_concurrent_workers(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
):
    # Pinned: an EOS-only reply of the lead (P ~0.1 % a call on tiny-random) is no output item for the SDK,
    # so `response.output[0]` would not exist and its second turn would leave the empty reply out (the
    # gateway then discards that call: counts differ). The fixed id and requests draw the same replies.
    eid, episode = await external_episode(temporal_client, gateway_url, "agents-sdk", pinned=True)
    provider = GroveModelProvider(episode)
    lead, config = lead_agent(), provider.run_config()
    result = await Runner.run(lead, "Fix the failing build.", run_config=config)
    [response] = result.raw_responses
    assert response.response_id == f"{LEAD}.0.c0"  # the root agent, under its own name
    item_id = response.output[0].id  # the SDK hands such an item to a tool as ToolContext.tool_call
    assert item_id == f"{LEAD}.0.c0"

    # the lead "calls" its worker tool twice in one response: two concurrent nested runs
    [tool] = lead.tools
    contexts_ = [tool_context(tool, f"call_t{i}", item_id, f"topic {i}", lead, config) for i in (0, 1)]
    outputs = await asyncio.gather(*(tool.on_invoke_tool(c, c.tool_arguments) for c in contexts_))
    assert all(isinstance(o, str) and "error occurred" not in o for o in outputs), outputs

    ctx = contexts(await summary(temporal_client, eid))
    workers = [f"Research-worker-call_t{i}" for i in (0, 1)]  # the SDK names, made header-safe
    for w in workers:
        assert ctx[f"{w}.0"].origin == ContextOrigin.SPAWN and ctx[f"{w}.0"].spawned_by_call == f"{LEAD}.0.c0"
        assert nonzero(ctx[f"{w}.0"].counts) == {CallState.COMPLETED: 1}
    assert ctx[f"{LEAD}.0"].origin == ContextOrigin.ROOT

    # a second turn of the lead on its own history continues its context exactly
    again = await Runner.run(
        lead, [*result.to_input_list(), {"role": "user", "content": "Go on."}], run_config=config
    )
    assert again.raw_responses[0].response_id == f"{LEAD}.0.c1"
    assert extension_of(recording_engine, eid, f"{LEAD}.0.c1", f"{LEAD}.0.c0")
    closed = await provider.episode.aclose(final_answer=str(again.final_output), wait=True)
    assert closed["result"]["status"] == "ok" and closed["result"]["counts"] == {"selected": 4}


class SummariseOnce:
    """A compacting `call_model_input_filter`, as a program writes one: once the history holds three items
    or more, its first two are replaced by a summary a summariser agent writes once (kept: later turns
    see the same summary in front of the rest)."""

    def __init__(self, provider: GroveModelProvider) -> None:
        self.provider = provider
        self.summarizer = Agent(name="Summarizer", instructions="Summarize in one line.")
        self.summaries: dict[str, str] = {}

    async def __call__(self, data: CallModelData) -> ModelInputData:
        items = data.model_data.input
        if len(items) < 3:
            return data.model_data
        key = json.dumps(items[:2], sort_keys=True, default=str)
        if key not in self.summaries:
            done = await Runner.run(self.summarizer, key, run_config=self.provider.run_config())
            self.summaries[key] = str(done.final_output)
        summary = {"role": "user", "content": f"Summary: {self.summaries[key]}"}
        return ModelInputData(input=[summary, *items[2:]], instructions=data.model_data.instructions)


async def test_a_compacting_filter_in_a_custom_agent_tool(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
    e2e_store,
    tiny_tokenizer,
):
    """A `function_tool` that runs an agent itself (three turns on one history) under the program's own
    compacting filter: the runs are one agent spawned by the lead's call; the filter's summariser call is
    that agent's auxiliary call (never trained); the first turn after the summary declares a rewrite; the
    turn after it extends the rewritten context on its exact tokens; every action is owned once."""
    eid, episode = await external_episode(temporal_client, gateway_url, "agents-sdk-compact", pinned=True)
    provider = GroveModelProvider(episode)
    helper = Agent(name="Helper", instructions="Answer briefly.")

    @function_tool
    async def ask_helper(input: str) -> str:  # `input`, as an `as_tool` agent-tool names its argument
        config = provider.run_config(call_model_input_filter=SummariseOnce(provider))
        history: list = [{"role": "user", "content": "Warm up."}]
        for turn in (input, "Go on."):
            done = await Runner.run(helper, history, run_config=config)
            history = [*done.to_input_list(), {"role": "user", "content": turn}]
        done = await Runner.run(helper, history, run_config=config)
        return str(done.final_output)

    lead = Agent(name="Lead", instructions="Delegate.", tools=[ask_helper])
    config = provider.run_config()
    first = await Runner.run(lead, "Fix the failing build.", run_config=config)
    item_id = first.raw_responses[0].response_id
    [tool] = lead.tools
    call = tool_context(tool, "call_h", item_id, "the build", lead, config)
    answer = await tool.on_invoke_tool(call, call.tool_arguments)
    assert isinstance(answer, str) and "error occurred" not in answer, answer

    w = "Helper-call_h"
    ctx = contexts(await summary(temporal_client, eid))
    assert ctx[f"{w}.0"].origin == ContextOrigin.SPAWN and ctx[f"{w}.0"].spawned_by_call == "Lead.0.c0"
    assert ctx[f"{w}.1"].origin == ContextOrigin.REWRITE and ctx[f"{w}.1"].rewrite_of == f"{w}.0"
    assert nonzero(ctx[f"{w}.1"].counts) == {CallState.COMPLETED: 2}  # the third turn continued it
    assert nonzero(ctx[f"{w}~summary.0"].counts) == {CallState.COMPLETED: 1}  # summarised once
    assert extension_of(recording_engine, eid, f"{w}.1.c1", f"{w}.1.c0")
    served = recording_engine.calls_of(eid)
    # the rewritten history the agent sent holds the summary the auxiliary call wrote
    summary_text = response_text(tiny_tokenizer, served[f"{w}~summary.0.c0"].completion_ids).strip()
    assert summary_text and summary_text in tiny_tokenizer.decode(served[f"{w}.1.c0"].prompt_ids)

    closed = await episode.aclose(answer, wait=True)
    result = closed["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 4, "auxiliary": 1}
    actions = ["Lead.0.c0", f"{w}.0.c0", f"{w}.1.c0", f"{w}.1.c1"]
    rows = rows_as_served(e2e_store, result["rows_key"], served)
    assert sorted(s.call_id for r in rows for s in r.spans if s.owned) == sorted(actions)


async def test_the_default_responses_model_is_captured(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
):
    """The SDK's default model (the Responses API), plain and streamed, against the real gateway: each run
    is captured as the agent its client names (`x-grove-agent`), and the close counts both calls."""
    import agents
    import openai

    eid, episode = await external_episode(temporal_client, gateway_url, "agents-sdk-responses")

    def model(agent: str):
        client = openai.AsyncOpenAI(
            base_url=episode.base_url, api_key=episode.api_key, max_retries=0,
            default_headers={"x-grove-agent": agent},
        )  # fmt: skip
        return agents.OpenAIResponsesModel(MODEL, openai_client=client)

    plain = await Runner.run(
        agents.Agent(name="Tutor", instructions="Answer.", model=model("Tutor")), "2 + 2?"
    )
    streamed = Runner.run_streamed(
        agents.Agent(name="Streamer", instructions="Answer.", model=model("Streamer")), "3?"
    )
    async for _event in streamed.stream_events():
        pass
    assert plain.raw_responses and all(r.response_id.startswith("resp_") for r in plain.raw_responses)
    assert sorted(recording_engine.calls_of(eid)) == ["Streamer.0.c0", "Tutor.0.c0"]
    closed = await episode.aclose(final_answer=str(plain.final_output), wait=True)
    assert closed["result"]["status"] == "ok" and closed["result"]["counts"] == {"selected": 2}


class FailFirstAttemptAfterResponse(GroveModelProvider):
    """Fault injection: the first attempt of the first model activity fails after the gateway answered
    (a worker that lost the response); Temporal retries the activity, which re-sends the request."""

    failed = False

    def get_model(self, model_name):
        model = super().get_model(model_name)
        get_response = model.get_response

        async def once_failing(*args, **kwargs):
            response = await get_response(*args, **kwargs)
            if not FailFirstAttemptAfterResponse.failed and activity.info().attempt == 1:
                FailFirstAttemptAfterResponse.failed = True
                raise RuntimeError(f"injected: the worker lost the response of {response.response_id}")
            return response

        model.get_response = once_failing
        return model


async def test_temporal_native_agents_retry_is_recognised_by_the_gateway(
    gateway_url,  # noqa: F811
    temporal_server,
    temporal_client,
    recording_engine,
    e2e_store,
):
    eid, episode = await external_episode(
        temporal_client, gateway_url, "agents-temporal", pinned=True
    )  # as above
    params = ModelActivityParameters(
        start_to_close_timeout=timedelta(seconds=180),
        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=3),
    )
    answer = await run_agents_workflow(
        temporal_server.address, FailFirstAttemptAfterResponse(), LeadWorkflow, episode, params, 300
    )
    assert FailFirstAttemptAfterResponse.failed
    # the retried activity re-sent the same request: the gateway discarded the first call and admitted
    # the retry in its place (same prompt tokens); the second turn continues the retry, exactly
    served = recording_engine.calls_of(eid)
    np.testing.assert_array_equal(served[f"{LEAD}.0.c0"].prompt_ids, served[f"{LEAD}.0.c1"].prompt_ids)
    ctx = contexts(await summary(temporal_client, eid))[f"{LEAD}.0"]
    assert (
        nonzero(ctx.counts) == {CallState.DISCARDED: 1, CallState.COMPLETED: 2} and ctx.head == f"{LEAD}.0.c2"
    )
    assert extension_of(recording_engine, eid, f"{LEAD}.0.c2", f"{LEAD}.0.c1")

    closed = await episode.aclose(answer, wait=True)
    result = closed["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2, "discarded": 1}
    [row] = published_rows(e2e_store, result["rows_key"])
    assert [s.call_id for s in row.spans] == [f"{LEAD}.0.c1", f"{LEAD}.0.c2"]  # the lost attempt: no row


async def test_a_handoff_spawns_the_agent_it_transfers_to(agents_script_stack: AgentsScriptStack):
    """`Runner.run` of a front desk whose (real, scripted) reply hands off to a specialist: the
    specialist's context is spawned by the front desk's call; the program declares nothing."""
    stack = agents_script_stack
    eid = await start_episode(stack.client, "agents-handoff")
    provider = GroveModelProvider(bind(stack.url, eid))
    result = await Runner.run(front_desk(script_settings()), ROUTE_USER, run_config=provider.run_config())
    [handoff] = [i for i in result.new_items if i.type == "handoff_call_item"]
    assert handoff.raw_item.id == f"{FRONT}.0.c0"  # the handoff call is an item of the front desk's call
    assert result.last_agent.name != front_desk().name
    await check_handoff_episode(stack, eid, provider.episode, result)


async def test_an_agent_handed_back_to_the_root_enters_it_again(agents_script_stack: AgentsScriptStack):
    """`Runner.run` of a concierge whose (real, scripted) reply hands off to a porter, whose reply hands
    back: the run ends with the concierge's answer, the concierge (the root agent) entering again in a
    context spawned by the porter's call; nothing declared by the program."""
    stack = agents_script_stack
    eid = await start_episode(stack.client, "agents-hand-back")
    provider = GroveModelProvider(bind(stack.url, eid))
    result = await Runner.run(concierge(), CARRY_USER, run_config=provider.run_config())
    await check_hand_back_episode(stack, eid, provider.episode, result)


async def test_a_temporal_native_handoff_spawns_the_agent_it_transfers_to(
    agents_script_stack: AgentsScriptStack,
):
    """The same program as a Temporal workflow: the identity filter runs in the workflow and reads the
    handoff call's grove id from the items the model activity returned."""
    stack = agents_script_stack
    eid = await start_episode(stack.client, "agents-temporal-handoff")
    episode = bind(stack.url, eid)
    params = ModelActivityParameters(start_to_close_timeout=timedelta(seconds=600))
    answer = await run_agents_workflow(
        stack.address, GroveModelProvider(), HandoffWorkflow, episode, params, 900
    )
    await check_handoff_episode(stack, eid, episode, answer)
