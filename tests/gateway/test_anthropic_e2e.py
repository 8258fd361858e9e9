"""The Anthropic Messages API on the capture gateway, on real services (the fixtures of
tests/gateway/test_app_e2e.py: uvicorn, the Temporal dev server, a grove worker with a real vLLM engine on
the tiny-random model, a local object store).

Harnesses are played by the `anthropic` Python client and raw httpx. What each call really was is read
from the engine (`recording_engine.served`), what the episode admitted from the workflow's `summary`
query, and the rows from the closed episode's parquet.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import numpy as np
import pytest

from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from grove.receipts import CallState, ContextOrigin
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.gateway import test_app_e2e as app_e2e
from tests.gateway.test_app_e2e import (
    MODEL,
    SECRET,
    close,
    delivered_summary,
    extension_of,
    start_episode,
    summary,
)
from trainer.rows import rows_from_parquet

gateway_url = app_e2e.gateway_url  # the fixture: the gateway of those tests, on their worker

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SYSTEM = [{"type": "text", "text": "You are a careful agent.", "cache_control": {"type": "ephemeral"}}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# A tool round trip the harness already holds (its first request's history): the policy's first call
# continues after it.
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 2}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, TOOL_USE]},
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "Summarise it."},
        ],
    },
]


def claude(url: str, episode_id: str, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{url}/episodes/{episode_ref(episode_id)}",
        api_key=issue_token(SECRET, episode_id),  # sent as x-api-key
        max_retries=0,
        default_headers=headers or None,
    )


def http(url: str, episode_id: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"{url}/episodes/{episode_ref(episode_id)}/v1",
        headers={"x-api-key": issue_token(SECRET, episode_id)},
        timeout=120,
    )


def echoed(message: anthropic.types.Message) -> dict:
    """The assistant turn as a harness re-sends it: its content blocks as it got them."""
    return {
        "role": "assistant",
        "content": [block.model_dump(exclude_none=True) for block in message.content],
    }


def sse(lines: list[str]) -> list[tuple[str, dict]]:
    """(event name, data) pairs of a server-sent event stream."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


async def test_messages_continue_exactly_json_then_stream_and_close_publishes_the_row(
    gateway_url, temporal_client, recording_engine, e2e_store
):
    eid = await start_episode(temporal_client, "anthropic-turns")
    client = claude(gateway_url, eid)
    first = await client.messages.create(
        model=MODEL, max_tokens=6, system=SYSTEM, messages=HISTORY, tools=[WEATHER],
        metadata={"user_id": "someone"}, thinking={"type": "disabled"}, extra_body={"temperature": 0.8},
    )  # fmt: skip
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    assert first.type == "message" and first.role == "assistant" and first.model == MODEL
    assert first.usage.input_tokens == served.prompt_ids.size
    assert first.usage.output_tokens == served.completion_ids.size <= 6
    assert first.stop_reason in ("end_turn", "max_tokens")
    # The history again, the tool_use input re-serialised in another key order: equal as JSON, it continues.
    reordered = {**TOOL_USE, "input": {"days": 2, "city": "Paris"}}
    history = [
        HISTORY[0],
        {"role": "assistant", "content": [HISTORY[1]["content"][0], reordered]},
        HISTORY[2],
    ]
    turn = [*history, echoed(first), {"role": "user", "content": "Go on."}]
    async with client.messages.stream(
        model=MODEL, max_tokens=6, system=SYSTEM, messages=turn, tools=[WEATHER], extra_query={"beta": "true"}
    ) as stream:
        second = await stream.get_final_message()
    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
    served = recording_engine.calls_of(eid)["parent.0.c1"]
    assert second.usage.input_tokens == served.prompt_ids.size
    assert second.usage.output_tokens == served.completion_ids.size
    s = await delivered_summary(temporal_client, eid)
    assert s.totals[CallState.COMPLETED] == 2 and {c.context_id for c in s.contexts} == {"parent.0"}

    r = await close(gateway_url, eid, {"final_answer": "done"}, wait=True)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2}
    [row] = rows_from_parquet(e2e_store.get(result["rows_key"]))
    assert [span.call_id for span in row.spans] == ["parent.0.c0", "parent.0.c1"]
    np.testing.assert_array_equal(row.input_ids, np.concatenate([served.prompt_ids, served.completion_ids]))


async def test_the_stream_is_anthropics_event_sequence_with_the_served_counts(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "anthropic-stream")
    request = {
        "model": MODEL,
        "max_tokens": 6,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi."}],
    }
    async with http(gateway_url, eid) as c, c.stream("POST", "/messages?beta=true", json=request) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-grove-call-id"] == "parent.0.c0"
        events = sse([line async for line in r.aiter_lines()])
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert names[2:-2] == (
        ["content_block_start", "content_block_delta", "content_block_stop"] if text else []
    )
    assert events[0][1]["message"]["usage"]["input_tokens"] == served.prompt_ids.size
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert delta["usage"]["output_tokens"] == served.completion_ids.size


async def test_count_tokens_is_the_policys_count_of_the_rendered_prompt(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "anthropic-count")
    client = claude(gateway_url, eid)
    counted = await client.messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=HISTORY, tools=[WEATHER]
    )
    assert not any((await summary(temporal_client, eid)).totals.values())  # counting admits nothing
    await client.messages.create(model=MODEL, max_tokens=4, system=SYSTEM, messages=HISTORY, tools=[WEATHER])
    assert counted.input_tokens == recording_engine.calls_of(eid)["parent.0.c0"].prompt_ids.size


async def test_bad_requests_get_anthropic_errors_and_admit_nothing(gateway_url, temporal_client):
    eid = await start_episode(temporal_client, "anthropic-bad")
    client = claude(gateway_url, eid)
    first = await client.messages.create(model=MODEL, max_tokens=4, messages=HISTORY)
    before = await delivered_summary(temporal_client, eid)
    edited = {**TOOL_USE, "input": {"city": "Rome", "days": 2}}
    turn = [HISTORY[0], {"role": "assistant", "content": [edited]}, HISTORY[2], echoed(first)]
    turn.append({"role": "user", "content": "More."})
    ok = [{"role": "user", "content": "hi"}]

    def body(messages: list, **extra) -> dict:
        return {"model": MODEL, "max_tokens": 4, "messages": messages, **extra}

    async with http(gateway_url, eid) as c:
        cases = {
            "image": await c.post(
                "/messages", json=body([{"role": "user", "content": [{"type": "image", "source": {}}]}])
            ),
            "orphan result": await c.post(
                "/messages",
                json=body(
                    [
                        {
                            "role": "user",
                            "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}],
                        }
                    ]
                ),
            ),
            "edited history": await c.post("/messages", json=body(turn)),
            "top_k": await c.post("/messages", json=body(ok, top_k=5)),
            "stop": await c.post("/messages", json=body(ok, stop_sequences=["END"])),
            "thinking": await c.post(
                "/messages", json=body(ok, thinking={"type": "enabled", "budget_tokens": 99})
            ),
            "unknown model": await c.post("/messages", json={**body(ok), "model": "claude-opus-4"}),
            "no key": await c.post(
                "/messages", json=body(ok), headers={"x-api-key": "", "authorization": ""}
            ),
            "other episode": await c.post(
                "/messages", json=body(ok), headers={"x-api-key": issue_token(SECRET, "other/ep")}
            ),
            "oversize": await c.post("/messages", json=body([{"role": "user", "content": "x" * (4 << 20)}])),
            "too long": await c.post(  # another agent's first request: measured, not compared with parent's
                "/messages",
                json=body([{"role": "user", "content": " ".join(f"word{i}" for i in range(600))}]),
                headers={"x-grove-agent": "longer"},
            ),
        }
    expect = {
        "image": (400, "invalid_request_error", "'image'"),
        "orphan result": (400, "invalid_request_error", "'toolu_9'"),
        "edited history": (400, "invalid_request_error", "message 1 differs"),
        "top_k": (400, "invalid_request_error", "top_k"),
        "stop": (400, "invalid_request_error", "stop"),
        "thinking": (400, "invalid_request_error", "CLAUDE_CODE_DISABLE_THINKING"),
        "unknown model": (404, "not_found_error", "claude-opus-4"),
        "no key": (401, "authentication_error", ""),
        "other episode": (403, "permission_error", ""),
        "oversize": (413, "request_too_large", "max_body_bytes"),
        "too long": (400, "invalid_request_error", "prompt is too long: "),
    }
    for name, response in cases.items():
        status, kind, says = expect[name]
        got = response.json()
        assert (response.status_code, got["type"], got["error"]["type"]) == (status, "error", kind), (
            name,
            got,
        )
        assert says in got["error"]["message"] and "Traceback" not in response.text, (name, got)
    assert await summary(temporal_client, eid) == before
    with pytest.raises(anthropic.BadRequestError) as refused:  # the SDK reads the shape as its own
        await client.messages.create(model=MODEL, max_tokens=4, messages=ok, extra_body={"top_k": 5})
    assert refused.value.body["error"]["type"] == "invalid_request_error"


async def test_claude_codes_subagent_compaction_and_rewrite_get_their_own_contexts(
    gateway_url, temporal_client
):
    """Claude Code's traffic without grove headers: the lead is "parent"; a request with
    x-claude-code-agent-id is a subagent spawned by the lead's call (here no `Agent` call matched its
    prompt: `worker-<id>`); its compaction's summary request is its `~summary` call; its next request,
    "This session is being continued...", rewrites its context."""
    eid = await start_episode(temporal_client, "claude-code")
    session = {"x-claude-code-session-id": "5a1e"}
    sub = {**session, "x-claude-code-agent-id": "0123456789abcdef"}
    lead = await claude(gateway_url, eid, **session).messages.create(
        model=MODEL, max_tokens=4, messages=HISTORY
    )
    worker = claude(gateway_url, eid, **sub)
    ask = [{"role": "user", "content": "Find the config."}]
    first = await worker.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=ask)
    assert first.headers["x-grove-agent"] == "worker-0123456789abcdef"
    turn = [*ask, echoed(await first.parse())]
    compact = [*turn, {"role": "user", "content": "CRITICAL: Respond with TEXT ONLY ... in <summary> tags."}]
    summarised = await worker.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=compact)
    assert summarised.headers["x-grove-agent"] == "worker-0123456789abcdef~summary"
    after = [
        {"role": "user", "content": "This session is being continued from a previous conversation. Go on."}
    ]
    rewritten = await worker.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=after)
    assert rewritten.headers["x-grove-context"] == "worker-0123456789abcdef.1"
    s = await delivered_summary(temporal_client, eid)
    by_id = {c.context_id: c for c in s.contexts}
    assert by_id["parent.0"].head == "parent.0.c0" and lead.stop_reason in ("end_turn", "max_tokens")
    spawned = by_id["worker-0123456789abcdef.0"]
    assert (spawned.origin, spawned.spawned_by_call) == (ContextOrigin.SPAWN, "parent.0.c0")
    assert by_id["worker-0123456789abcdef.1"].rewrite_of == "worker-0123456789abcdef.0"
    assert by_id["worker-0123456789abcdef~summary.0"].counts[CallState.COMPLETED] == 1
