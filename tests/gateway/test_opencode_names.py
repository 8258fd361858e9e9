"""OpenCode subagents named after their agent type (gateway/pipeline/opencode_names.py,
harnesses/opencode_agents.py): from the `task` call that started each session, independent of which session's
request arrives first, stored once per session, the same in the runner's outcome."""

from __future__ import annotations

import itertools
import json

import pytest

from capture.records import ChatRecord, Usage
from gateway.pipeline.opencode_names import SubagentName, derive, session_names, task_calls
from grove.receipts import CallKind
from harnesses.opencode_agents import subagent_name, subagent_names
from storage.local import LocalStore

EPISODE = "run/s0/t0/g0"


def task(subagent_type: str, prompt: str) -> dict:
    args = {"description": "d", "prompt": prompt, "subagent_type": subagent_type}
    return {"type": "function", "function": {"name": "task", "arguments": json.dumps(args)}}


def spawning(call_id: str, *calls: dict) -> ChatRecord:
    return ChatRecord(
        episode_id=EPISODE, call_id=call_id, context_id=call_id.rsplit(".", 1)[0], agent="parent",
        kind=CallKind.ACTION, extends=None, messages=[],
        response={"role": "assistant", "tool_calls": list(calls)},
        finish_reason="tool_calls", usage=Usage(prompt_tokens=1, completion_tokens=1), policy_version=0,
    )  # fmt: skip


def first_request(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "You research."}, {"role": "user", "content": prompt}]


ROUND = spawning(
    "parent.0.c0", task("researcher", "look at A"), task("critic", "check B"), task("researcher", "look at C")
)


def test_names_come_from_the_task_calls_whatever_order_the_sessions_arrive_in():
    want = {"look at A": "researcher", "check B": "critic", "look at C": "researcher-2"}
    for order in itertools.permutations(want):
        others: list[SubagentName] = []
        for prompt in order:
            name = derive(f"ses_{prompt[-1]}", first_request(prompt), ROUND, others)
            assert name.agent == want[prompt], (order, prompt, name)
            others.append(name)


def test_a_later_round_counts_the_earlier_rounds_sessions_of_its_type():
    a = derive("ses_a", first_request("look at A"), ROUND, [])
    c = derive("ses_c", first_request("look at C"), ROUND, [a])
    later = spawning("parent.0.c1", task("researcher", "look at D"))
    assert derive("ses_d", first_request("look at D"), later, [a, c]).agent == "researcher-3"


def test_identical_task_prompts_take_the_calls_in_turn_and_unmatched_sessions_keep_their_session_name():
    twins = spawning("parent.0.c0", task("worker", "Say red"), task("worker", "Say red"))
    first = derive("ses_a", first_request("Say red"), twins, [])
    second = derive("ses_b", first_request("Say red"), twins, [first])
    assert (first.agent, second.agent) == ("worker", "worker-2")
    assert derive("ses_x", first_request("something else"), twins, []).agent == "worker-ses_x"
    assert derive("ses_y", first_request("Say red"), None, []).agent == "worker-ses_y"


def test_names_are_header_safe_and_never_the_root_agent():
    assert subagent_name("parent", 1) == "parent-1" and subagent_name("critic", 2) == "critic-2"
    assert subagent_name("Code reviewer", 1).startswith("Code-reviewer-")
    assert subagent_names(["worker", "critic", "worker", "worker"]) == [
        "worker",
        "critic",
        "worker-2",
        "worker-3",
    ]
    assert task_calls(
        {"tool_calls": [task("a", "p"), {"function": {"name": "read", "arguments": "{}"}}]}
    ) == [("a", "p")]


@pytest.mark.parametrize("aliased", [False, True])
async def test_a_session_is_named_once_and_its_summary_call_keeps_the_name(tmp_path, aliased):
    store = LocalStore(tmp_path)
    records = {ROUND.call_id: ROUND}

    async def load(call_id: str):
        return records.get(call_id)

    async def head(agent: str):
        return ROUND.call_id if agent == "parent" else None

    child = {"x-session-id": "ses_c", "x-parent-session-id": "ses_root"}
    names = await session_names(store, EPISODE, child, first_request("look at C"), head, load, {})
    assert names == {"ses_c": "researcher-2"}
    # its compaction-summary call has no parent header: the stored name still applies
    later = await session_names(store, EPISODE, {"x-session-id": "ses_c"}, [], head, load, {})
    assert later == {"ses_c": "researcher-2"}
    assert await session_names(store, EPISODE, {"x-session-id": "ses_root"}, [], head, load, {}) == {}
    # a relaunch's alias (the recorded agent a session replays) wins over everything
    aliases = {"ses_c": "researcher"} if aliased else {}
    got = await session_names(store, EPISODE, child, first_request("look at C"), head, load, aliases)
    assert got["ses_c"] == ("researcher" if aliased else "researcher-2")
    # grove's own headers: not OpenCode's adapter, nothing named
    assert await session_names(store, EPISODE, {**child, "x-grove-agent": "a"}, [], head, load, {}) == {}
