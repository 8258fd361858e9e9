"""Streamed Agents SDK runs (`Runner.run_streamed`) on real services: grove's ModelProvider against the real
gateway (uvicorn), a Temporal dev server and a grove worker whose real vLLM engine serves a policy that
plays the program's script (tests/fixtures/agents_script.py, tests/harnesses/agents_stream_model.py): the
lead's first reply is two `worker` tool calls, which arrive in the stream and which the SDK runs as two
nested (streamed) runs of the worker agent; the lead then answers on its own history. Every model call is
a real engine call; the rows are checked against what the engine served.

The streamed handoff: a front desk's streamed reply is a handoff to a specialist; the SDK runs the
specialist on the history it hands over, and the specialist is recorded as spawned by the call that
handed off (nothing declared by the program).

The dropped stream: a gate holds the gateway's response after its first part (tests/gateway/
test_delivery_e2e.py's SendGate), the program cancels its run on the first event, and the call must be
discarded (docs/reliability.md: an undelivered response is not trained as an accepted action).
"""

from __future__ import annotations

import asyncio

import pytest
from agents import Runner
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent

from grove.receipts import CallState, ContextOrigin
from harnesses.clients.agents_sdk import GroveModelProvider
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.fixtures.agents_script import AgentsScriptStack
from tests.gateway.test_app_e2e import contexts, start_episode, summary
from tests.harnesses.agents_handoff_kit import FRONT, check_hand_back_episode, check_handoff_episode
from tests.harnesses.agents_stream_model import (
    CARRY_USER,
    ROUTE_USER,
    USER,
    WORDS,
    concierge,
    front_desk,
    lead_agent,
    script_settings,
)
from tests.harnesses.framework_kit import bind, nonzero, rows_as_served

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

SETTINGS = script_settings()
LEAD = "Stream-lead"  # the lead, "Stream lead", under its own name


@pytest.fixture
def stack(agents_script_stack: AgentsScriptStack) -> AgentsScriptStack:
    """The session's grove on the script model (tests/fixtures/agents_script.py)."""
    return agents_script_stack


def provider_for(stack: AgentsScriptStack, eid: str) -> GroveModelProvider:
    return GroveModelProvider(bind(stack.url, eid))


async def streamed_program(provider: GroveModelProvider, nested: list) -> tuple[object, list]:
    """The program: the lead streamed to the end; each worker tool's nested run streamed into `nested`."""
    lead = lead_agent(SETTINGS, on_stream=nested.append)
    result = Runner.run_streamed(lead, USER, run_config=provider.run_config())
    events = [e async for e in result.stream_events()]
    return result, events


def check_rows(stack: AgentsScriptStack, eid: str, rows_key: str, dropped: set[str] = frozenset()) -> list:
    served = stack.engine.calls_of(eid)
    rows = rows_as_served(stack.store, rows_key, served)
    for row in rows:
        assert not {s.call_id for s in row.spans} & dropped
    owned = sorted(s.call_id for row in rows for s in row.spans if s.owned)
    assert owned == sorted(set(served) - dropped)  # every delivered call trained once, the dropped none
    return rows


def check_streamed_episode(
    stack: AgentsScriptStack, eid: str, run, events: list, nested: list, ctx: dict, lead: str
) -> None:
    """The lead's call `lead` (Stream-lead.0.c<n>) streamed two tool calls; the SDK ran both workers from
    them, each spawned by that call, streamed; the lead answered on its history."""
    tool_items = [e.item for e in events if isinstance(e, RunItemStreamEvent) and e.name == "tool_called"]
    calls = [item.raw_item for item in tool_items]
    assert [(c.name, c.arguments) for c in calls] == [("worker", f'{{"input": "{w}"}}') for w in WORDS]
    assert all(c.id == lead for c in calls)  # the stream's items carry the grove call id
    done = [
        e.data.item
        for e in events
        if isinstance(e, RawResponsesStreamEvent) and e.data.type == "response.output_item.done"
    ]
    assert [(i.name, i.id) for i in done if i.type == "function_call"] == [("worker", lead)] * 2
    assert [r.response_id for r in run.raw_responses] == [lead, f"{LEAD}.0.c{int(lead[-1]) + 1}"]
    assert run.final_output == " ".join(WORDS)
    served = stack.engine.calls_of(eid)
    for r in run.raw_responses:  # the stream's usage chunk: the call's real token counts
        s = served[r.response_id]
        assert (r.usage.input_tokens, r.usage.output_tokens) == (s.prompt_ids.size, s.completion_ids.size)
    workers = [f"Stream-worker-{c.call_id}" for c in calls]  # the SDK name, header-safe, per invocation
    for w in workers:
        assert ctx[f"{w}.0"].origin == ContextOrigin.SPAWN and ctx[f"{w}.0"].spawned_by_call == lead
        assert nonzero(ctx[f"{w}.0"].counts) == {CallState.COMPLETED: 1}
    # the nested runs were streamed: each one's completed response is its worker's grove call
    completed = {
        p["event"].data.response.id
        for p in nested
        if isinstance(p["event"], RawResponsesStreamEvent) and p["event"].data.type == "response.completed"
    }
    assert completed == {f"{w}.0.c0" for w in workers}
    assert ctx[f"{LEAD}.0"].origin == ContextOrigin.ROOT


async def test_streamed_run_runs_streamed_tool_calls_as_spawned_workers(stack):
    eid = await start_episode(stack.client, "agents-stream")
    provider, nested = provider_for(stack, eid), []
    result, events = await asyncio.wait_for(streamed_program(provider, nested), RESULT_WAIT)
    ctx = contexts(await summary(stack.client, eid))
    check_streamed_episode(stack, eid, result, events, nested, ctx, f"{LEAD}.0.c0")
    assert nonzero(ctx[f"{LEAD}.0"].counts) == {CallState.COMPLETED: 2}
    closed = await provider.episode.aclose(final_answer=str(result.final_output), wait=True)
    assert closed["result"]["status"] == "ok" and closed["result"]["counts"] == {"selected": 4}
    rows = check_rows(stack, eid, closed["result"]["rows_key"])
    assert len(rows) == 3  # the lead's two calls in one row, one row per worker


async def test_a_streamed_run_dropped_mid_way_is_not_trained(stack):
    """The program cancels its streamed run on the first event while the gateway holds the rest of the
    lead's response: the call was never delivered whole, so it is discarded; the program's second run
    starts the lead's context afresh and is trained, the dropped call nowhere."""
    eid = await start_episode(stack.client, "agents-stream-drop")
    provider = provider_for(stack, eid)
    gate = stack.sends.arm()
    dropped = Runner.run_streamed(lead_agent(SETTINGS), USER, run_config=provider.run_config())
    async for event in dropped.stream_events():
        if isinstance(event, RawResponsesStreamEvent):
            await asyncio.wait_for(gate.held.wait(), STATE_WAIT)  # the server holds the rest of the stream
            dropped.cancel()  # the program gives up: the run's model stream closes its connection
    await asyncio.wait_for(gate.finished.wait(), STATE_WAIT)  # the server saw the client go and settled
    s = await summary(stack.client, eid)
    assert nonzero(contexts(s)[f"{LEAD}.0"].counts) == {CallState.DISCARDED: 1}
    assert contexts(s)[f"{LEAD}.0"].head is None

    nested: list = []
    result, events = await asyncio.wait_for(streamed_program(provider, nested), RESULT_WAIT)
    ctx = contexts(await summary(stack.client, eid))
    check_streamed_episode(stack, eid, result, events, nested, ctx, f"{LEAD}.0.c1")
    assert nonzero(ctx[f"{LEAD}.0"].counts) == {CallState.DISCARDED: 1, CallState.COMPLETED: 2}
    closed = await provider.episode.aclose(final_answer=str(result.final_output), wait=True)
    assert closed["result"]["counts"] == {"selected": 4, "discarded": 1}
    check_rows(stack, eid, closed["result"]["rows_key"], dropped={f"{LEAD}.0.c0"})


async def test_a_streamed_handoff_spawns_the_agent_it_transfers_to(stack):
    eid = await start_episode(stack.client, "agents-stream-handoff")
    provider = provider_for(stack, eid)
    result = Runner.run_streamed(front_desk(SETTINGS), ROUTE_USER, run_config=provider.run_config())
    events = [e async for e in result.stream_events()]
    handoffs = [e.item for e in events if isinstance(e, RunItemStreamEvent) and e.name == "handoff_requested"]
    assert [h.raw_item.id for h in handoffs] == [f"{FRONT}.0.c0"]  # the stream's item names the grove call
    await check_handoff_episode(stack, eid, provider.episode, result)


async def test_a_streamed_hand_back_enters_the_root_agent_again(stack):
    """The hand-back program streamed: the same contexts and spawn links as `Runner.run`'s."""
    eid = await start_episode(stack.client, "agents-stream-hand-back")
    provider = provider_for(stack, eid)
    result = Runner.run_streamed(concierge(), CARRY_USER, run_config=provider.run_config())
    events = [e async for e in result.stream_events()]
    handoffs = [e.item for e in events if isinstance(e, RunItemStreamEvent) and e.name == "handoff_requested"]
    assert [h.raw_item.id for h in handoffs] == ["Concierge.0.c0", "Porter.0.c0"]
    await check_hand_back_episode(stack, eid, provider.episode, result)
