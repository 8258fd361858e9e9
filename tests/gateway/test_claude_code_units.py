"""Claude Code's identity without grove headers (gateway/pipeline/claude_code.py,
gateway/pipeline/claude_code_names.py): the lead, subagents named after the `subagent_type` of the
lead's `Agent` call that started them, the compaction's summary request and the rewrite after it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from capture.records import ChatRecord, Usage
from gateway.intake.messages_request import parse_messages_request
from gateway.pipeline.claude_code import AGENT_ID_HEADER, SESSION_HEADER, identify
from gateway.pipeline.claude_code_names import derive, recent_calls, subagent_name_of
from gateway.pipeline.continuation import Move, decide
from gateway.pipeline.identity import RewriteMode, Spawner
from gateway.pipeline.opencode_names import SubagentName
from grove.receipts import CallKind
from storage.local import LocalStore

LEAD = {SESSION_HEADER: "3f0c"}


def agent_call(i: int, prompt: str, subagent_type: str | None) -> dict:
    args = {
        "description": "d",
        "prompt": prompt,
        **({"subagent_type": subagent_type} if subagent_type else {}),
    }
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "Agent", "arguments": json.dumps(args)},
    }


def lead_record(call_id: str, calls: list[dict]) -> ChatRecord:
    return ChatRecord(
        episode_id="ep/1", call_id=call_id, context_id="parent.0", agent="parent", kind=CallKind.ACTION,
        extends=None, messages=[{"role": "user", "content": "go"}], tools=None,
        response={"role": "assistant", "content": None, "tool_calls": calls}, finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1), policy_version=0,
    )  # fmt: skip


def first_request(prompt: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a subagent."},
        {"role": "user", "content": "<system-reminder>env</system-reminder>\n\n" + prompt},
    ]


SPAWNING = lead_record(
    "parent.0.c2",
    [
        agent_call(0, "Find the config.", "researcher"),
        agent_call(1, "Find the tests.", "researcher"),
        agent_call(2, "Review it.", None),
    ],
)


def test_subagents_are_named_after_the_type_of_the_agent_call_whose_prompt_they_hold():
    second = derive("a2", first_request("Find the tests."), [SPAWNING], [])
    assert second == SubagentName(
        agent="researcher-2", subagent_type="researcher", spawned_by="parent.0.c2", position=2
    )
    first = derive("a1", first_request("Find the config."), [SPAWNING], [second])
    assert (first.agent, first.position) == ("researcher", 1)
    untyped = derive("a3", first_request("Review it."), [SPAWNING], [first, second])
    assert untyped.agent == "general-purpose" and untyped.spawned_by == "parent.0.c2"
    # the same prompt again from the same call: the next unclaimed call of that response, none left here
    assert derive("a4", first_request("Find the config."), [SPAWNING], [first, second]).agent == "worker-a4"
    # a later call of the lead starts another researcher: numbered after the earlier call's two
    later = lead_record("parent.0.c3", [agent_call(0, "Find more.", "researcher")])
    third = derive("a5", first_request("Find more."), [later, SPAWNING], [first, second])
    assert (third.agent, third.spawned_by) == ("researcher-3", "parent.0.c3")


def test_the_spawning_call_is_found_among_the_leads_last_calls_even_behind_a_generating_head():
    records = {"parent.0.c2": SPAWNING}

    async def load(call_id: str) -> ChatRecord | None:
        return records.get(call_id)

    found = asyncio.run(recent_calls("parent.0.c4", load))  # c4 generating, c3 never recorded
    assert [r.call_id for r in found] == ["parent.0.c2"]


def test_a_name_is_derived_once_and_read_back_by_the_subagents_later_requests(tmp_path):
    store = LocalStore(tmp_path)
    heads = ["parent.0.c2"]

    async def lead_head(agent: str) -> str | None:
        assert agent == "parent"
        return heads[0]

    async def load(call_id: str) -> ChatRecord | None:
        return SPAWNING if call_id == "parent.0.c2" else None

    headers = {**LEAD, AGENT_ID_HEADER: "a1b2c3d4e5f60718"}
    name = asyncio.run(
        subagent_name_of(store, "ep/1", headers, first_request("Find the tests."), lead_head, load)
    )
    assert name is not None and name.agent == "researcher-2"
    heads[0] = "parent.9.c0"  # the lead moved on: the stored name stands
    again = asyncio.run(
        subagent_name_of(store, "ep/1", headers, [{"role": "user", "content": "x"}], lead_head, load)
    )
    assert again == name
    assert asyncio.run(subagent_name_of(store, "ep/1", LEAD, [], lead_head, load)) is None  # the lead


def test_identity_of_the_lead_a_subagent_its_summary_call_and_the_rewrite_after_it():
    name = SubagentName(agent="researcher", subagent_type="researcher", spawned_by="parent.0.c2", position=1)
    sub = {**LEAD, AGENT_ID_HEADER: "a1b2c3d4e5f60718"}
    ask = [{"role": "user", "content": "hi"}]
    lead = identify(LEAD, ask, None)
    assert (lead.agent, lead.spawner, lead.rewrite, lead.kind) == (
        "parent",
        None,
        RewriteMode.NONE,
        CallKind.ACTION,
    )
    worker = identify(sub, ask, name)
    assert (worker.agent, worker.spawner) == ("researcher", Spawner(call_id="parent.0.c2"))
    unnamed = identify(sub, ask, None)
    assert (unnamed.agent, unnamed.spawner) == ("worker-a1b2c3d4e5f60718", Spawner(agent="parent"))
    compact = [*ask, {"role": "assistant", "content": "ok"}]
    compact.append(
        {"role": "user", "content": "CRITICAL: Respond with TEXT ONLY. ... <summary>...</summary>"}
    )
    summary = identify(sub, compact, name)
    assert (summary.agent, summary.kind) == ("researcher~summary", CallKind.SUMMARY)
    after = [
        {
            "role": "user",
            "content": "This session is being continued from a previous conversation. Summary: x",
        }
    ]
    assert identify(LEAD, after, None).rewrite == RewriteMode.IF_NOT_EXTENSION


CAPTURED = Path(__file__).resolve().parents[2] / "models/harness_text/claude_code_2_1_332.json"


def test_stock_claude_codes_captured_requests_are_accepted_and_recognised():
    """The requests stock Claude Code 2.1.332 sent (models/harness_text/claude_code_2_1_332.json): each is
    accepted as it is; the lead is the parent, the worker is named after the lead's Agent call, the
    compaction request is the lead's summary call and the request after it a rewrite."""
    captured = json.loads(CAPTURED.read_text())
    requests = captured["requests"]
    parsed = {
        name: parse_messages_request(r["body"], r["body"]["model"]).canonical()
        for name, r in requests.items()
    }
    headers = {name: {k.lower(): v for k, v in r["headers"].items()} for name, r in requests.items()}
    assert parsed["lead_first"].tools is not None  # the deferred placeholder left out, Agent kept
    assert [t["function"]["name"] for t in parsed["lead_first"].tools] == ["Agent"]
    lead = identify(headers["lead_first"], parsed["lead_first"].messages, None)
    assert (lead.agent, lead.kind, lead.rewrite) == ("parent", CallKind.ACTION, RewriteMode.NONE)
    summary = identify(headers["summary"], parsed["summary"].messages, None)
    assert (summary.agent, summary.kind) == ("parent~summary", CallKind.SUMMARY)
    assert identify(headers["after_compaction"], parsed["after_compaction"].messages, None).rewrite == (
        RewriteMode.IF_NOT_EXTENSION
    )
    for name in ("lead_resume", "lead_async_launched", "lead_notified"):
        got = identify(headers[name], parsed[name].messages, None)
        assert (got.agent, got.kind, got.rewrite) == ("parent", CallKind.ACTION, RewriteMode.NONE), name
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
        }
        for b in captured["scripted_answers"]["lead_first"]
    ]
    spawning = lead_record("parent.0.c0", calls)
    subagent = headers["worker_first"]["x-claude-code-agent-id"]
    name = derive(subagent, parsed["worker_first"].messages, [spawning], [])
    assert name == SubagentName(agent="worker", subagent_type="worker", spawned_by="parent.0.c0", position=1)
    worker = identify(headers["worker_first"], parsed["worker_first"].messages, name)
    assert (worker.agent, worker.spawner) == ("worker", Spawner(call_id="parent.0.c0"))
    # the lead's next request re-sends its Agent calls as tool_use blocks with their results: it continues
    # the call that made them (its generated tokens are what the continuation splices)
    made = spawning.model_copy(
        update={"messages": parsed["lead_first"].messages, "tools": parsed["lead_first"].tools}
    )
    resumed = parsed["lead_resume"]
    assert decide(resumed.messages, resumed.tools, made, RewriteMode.NONE).move == Move.CONTINUE
