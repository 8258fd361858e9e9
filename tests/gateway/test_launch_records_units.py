"""Relaunch replay's pure parts (gateway/pipeline/launch_records.py): prompt digests, launch headers, which
agent a relaunched session may replay, and the prompt index / session aliases in a real local store."""

from __future__ import annotations

import pytest

from gateway.pipeline.launch_records import (
    InvalidLaunchHeaderError,
    SessionAlias,
    agent_fits,
    base_agent,
    claimed_agents,
    index_call,
    indexed_calls,
    launch_of,
    load_aliases,
    program_agent,
    program_session,
    prompt_digest,
    replay_agent,
    save_alias,
)
from storage.local import LocalStore

SYSTEM = {"role": "system", "content": "You are the lead."}
USER = {"role": "user", "content": "Words:\nsnow\nbook"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "task", "arguments": '{"prompt": "snow", "n": 1}'},
        }
    ],
}
TOOLS = [{"type": "function", "function": {"name": "task", "parameters": {"type": "object"}}}]


def test_digest_is_semantic_like_continuation_equality():
    base = prompt_digest([SYSTEM, USER, CALL], TOOLS)
    compact = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_other",
                "type": "function",
                "function": {"name": "task", "arguments": '{"n":1,"prompt":"snow"}'},
            }
        ],
    }
    assert prompt_digest([SYSTEM, USER, compact], TOOLS) == base  # re-serialised arguments, other call id
    assert prompt_digest([SYSTEM, USER, CALL], None) != base  # tools matter
    other_args = {
        **CALL,
        "tool_calls": [
            {
                **CALL["tool_calls"][0],
                "function": {"name": "task", "arguments": '{"prompt": "snow", "n": 1.0}'},
            }
        ],
    }
    assert prompt_digest([SYSTEM, USER, other_args], TOOLS) != base  # type-strict: 1 is not 1.0
    assert prompt_digest([SYSTEM, {"role": "user", "content": "Words:\nsnow\nbool"}, CALL], TOOLS) != base


@pytest.mark.parametrize("raw, launch", [(None, None), ("1", 1), ("17", 17)])
def test_launch_header(raw, launch):
    assert launch_of({} if raw is None else {"x-grove-launch": raw}) == launch


@pytest.mark.parametrize("raw", ["0", "-1", "x", "1001", "1.5", ""])
def test_bad_launch_headers_are_refused(raw):
    with pytest.raises(InvalidLaunchHeaderError, match="x-grove-launch"):
        launch_of({"x-grove-launch": raw})


def test_which_agents_a_session_may_replay():
    assert agent_fits("parent", child_session=False) and agent_fits("parent~title", child_session=False)
    assert not agent_fits("worker-ses_a", child_session=False)
    assert agent_fits("worker-ses_a", child_session=True) and agent_fits("worker-ses_a~summary", True)
    assert not agent_fits("parent", child_session=True)
    assert base_agent("worker-ses_a~summary") == "worker-ses_a"
    aliases = {"s1": SessionAlias(agent="worker-a"), "s2": SessionAlias(agent="worker-b")}
    assert claimed_agents(aliases, "s1") == {"worker-b"}


def test_a_programs_agent_replays_only_its_own_calls_under_the_same_name():
    """Python programs have no sessions: the agent as named is the session
    (gateway/pipeline/launch_records.py)."""
    assert program_agent({}) == "parent"  # no identity header: the default agent
    assert program_agent({"x-grove-agent": "worker-2", "x-grove-spawned-by": "parent.0.c0"}) == "worker-2"
    summary_call = {"x-grove-agent": "worker-2", "x-grove-call-kind": "auxiliary"}
    assert program_agent(summary_call) == "worker-2~aux"  # its auxiliary agent, a session of its own
    assert program_agent({"x-grove-agent": "Research agent"}).startswith("Research-agent-")  # canonical
    assert program_agent({"x-grove-context": "worker-2.1"}) is None  # places its calls itself
    assert program_session("worker-2") != program_session("worker-2~aux")
    assert not program_session("parent").startswith("ses_")  # never an OpenCode session id
    # a program's agent: exactly its own records, whatever other sessions replay
    assert replay_agent("worker-2", "worker-2", None, {"worker-2"}, False) == "worker-2"
    assert replay_agent("worker-1", "worker-2", None, set(), False) is None
    assert replay_agent("worker-2~aux", "worker-2", None, set(), False) is None
    assert replay_agent("worker-2~aux", "worker-2~aux", None, set(), False) == "worker-2~aux"
    # OpenCode sessions as before: a child session a worker no other session replays, then that one only
    assert replay_agent("worker-ses_a", None, None, set(), True) == "worker-ses_a"
    assert replay_agent("worker-ses_a", None, None, {"worker-ses_a"}, True) is None
    assert replay_agent("parent", None, None, set(), True) is None
    mine = SessionAlias(agent="worker-ses_a")
    assert replay_agent("worker-ses_a~summary", None, mine, set(), True) == "worker-ses_a"
    assert replay_agent("worker-ses_b", None, mine, set(), True) is None


def test_index_and_aliases_round_trip_in_a_store(tmp_path):
    store = LocalStore(tmp_path)
    digest = prompt_digest([SYSTEM, USER], TOOLS)
    for call in ("worker-b.0.c0", "worker-a.0.c0", "worker-a.0.c0"):  # idempotent
        index_call(store, "run/s1/t0/g0", digest, call)
    assert indexed_calls(store, "run/s1/t0/g0", digest) == ["worker-a.0.c0", "worker-b.0.c0"]
    assert indexed_calls(store, "run/s1/t0/g1", digest) == []
    save_alias(store, "run/s1/t0/g0", 2, "ses_x", SessionAlias(agent="parent", last_replayed="parent.0.c0"))
    save_alias(store, "run/s1/t0/g0", 2, "ses_x", SessionAlias(agent="parent", last_replayed="parent.0.c1"))
    assert load_aliases(store, "run/s1/t0/g0", 2) == {
        "ses_x": SessionAlias(agent="parent", last_replayed="parent.0.c1")
    }
    assert load_aliases(store, "run/s1/t0/g0", 3) == {}
