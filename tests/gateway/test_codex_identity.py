"""Codex's requests identified by their turn metadata (gateway/pipeline/codex.py), on the requests stock
Codex 0.171.0 really sent (models/harness_text/codex_0_171_0.json): the lead is `parent`, a subagent is
named from the lead's spawn_agent call (`worker`, `worker-2`, in the order the lead wrote them, whichever
subagent's request comes first), spawned by the lead's head; the compaction request is the agent's
summary call; the first turn of the next window is a rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.records import ChatRecord, Usage
from gateway.intake.responses_chat import chat_form
from gateway.intake.responses_request import parse_responses_request
from gateway.pipeline.codex import TURN_METADATA_HEADER, InvalidCodexMetadataError, identify
from gateway.pipeline.identity import RewriteMode, Spawner
from gateway.pipeline.opencode_names import session_names
from gateway.pipeline.routing import identify as route_identity
from gateway.pipeline.routing import view_request
from grove.receipts import CallKind
from ledger.context_view import ContextView
from storage.local import LocalStore

REQUESTS = json.loads(
    (Path(__file__).resolve().parents[2] / "models" / "harness_text" / "codex_0_171_0.json").read_text()
)["requests"]
EPISODE = "cx/1"


def _messages(name: str) -> list[dict]:
    return chat_form(parse_responses_request(REQUESTS[name]["body"], "grove")).messages


def _meta(name: str) -> dict:
    return json.loads(REQUESTS[name]["headers"][TURN_METADATA_HEADER])


def _headers(meta: dict) -> dict[str, str]:
    return {TURN_METADATA_HEADER: json.dumps(meta)}


def _spawning(messages: list[str]) -> ChatRecord:
    calls = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": "spawn_agent", "arguments": json.dumps({"message": m})}}
        for i, m in enumerate(messages)
    ]  # fmt: skip
    return ChatRecord(
        episode_id=EPISODE, call_id="parent.0.c0", context_id="parent.0", agent="parent", kind="action",
        extends=None, messages=[], response={"role": "assistant", "content": None, "tool_calls": calls},
        finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1), policy_version=0,
    )  # fmt: skip


async def _names(store, headers: dict, messages: list[dict], spawning: ChatRecord) -> dict[str, str]:
    async def head(agent: str) -> str | None:
        return spawning.call_id if agent == "parent" else None

    async def record(call_id: str) -> ChatRecord | None:
        return spawning if call_id == spawning.call_id else None

    return await session_names(store, EPISODE, headers, messages, head, record, {})


def test_the_lead_is_the_parent_and_claims_the_root():
    meta = _meta("agents_lead_first")
    identity = identify(_headers(meta), _messages("agents_lead_first"), None, set())
    assert identity.agent == "parent" and identity.spawner is None and identity.root_session
    assert identity.session_id == meta["thread_id"] and identity.rewrite == RewriteMode.NONE


@pytest.mark.parametrize("second_first", [False, True])
async def test_subagents_are_named_from_the_leads_spawn_calls_in_their_order(tmp_path, second_first):
    store = LocalStore(tmp_path)
    meta = _meta("agents_subagent_first")
    assert meta["parent_thread_id"] == _meta("agents_lead_first")["thread_id"]
    first = _messages("agents_subagent_first")
    assert first[-1] == {"role": "user", "content": "Repeat the word: apple"}
    second = [*first[:-1], {"role": "user", "content": "Repeat the word: pear"}]
    spawning = _spawning(["Repeat the word: apple", "Repeat the word: pear"])
    threads = {"apple": {**meta, "thread_id": "thread-apple"}, "pear": {**meta, "thread_id": "thread-pear"}}
    order = [("pear", second), ("apple", first)] if second_first else [("apple", first), ("pear", second)]
    names = {}
    for word, messages in order:
        headers = _headers(threads[word])
        found = await _names(store, headers, messages, spawning)
        identity = identify(headers, messages, None, {"parent"}, found)
        assert identity.spawner == Spawner(agent="parent") and not identity.root_session
        names[word] = identity.agent
    assert names == {"apple": "worker", "pear": "worker-2"}
    # a later request of a subagent finds its stored name
    again = await _names(store, _headers(threads["pear"]), second, spawning)
    assert again["thread-pear"] == "worker-2"


def test_the_compaction_request_is_the_agents_summary_call():
    meta = _meta("compaction_summary_call")
    assert meta["request_kind"] == "compaction"
    identity = identify(_headers(meta), _messages("compaction_summary_call"), None, {"parent"})
    assert identity.agent == "parent~summary" and identity.kind == CallKind.SUMMARY
    assert identity.rewrite == RewriteMode.IF_NOT_EXTENSION


def test_the_next_windows_first_turn_is_a_rewrite():
    meta = _meta("compaction_next_window")
    assert meta["window_number"] == 1
    identity = identify(_headers(meta), _messages("compaction_next_window"), None, {"parent"})
    assert identity.agent == "parent" and identity.rewrite == RewriteMode.IF_NOT_EXTENSION


def test_routing_dispatches_on_the_metadata_and_grove_headers_win():
    meta = _meta("agents_subagent_first")
    view = ContextView(episode_id=EPISODE, group_id="g", totals={}, contexts=[], closed=False)
    headers = _headers(meta)
    assert f"worker-{meta['thread_id']}" in view_request(headers).agents
    unnamed = route_identity(headers, _messages("agents_subagent_first"), None, view)
    assert unnamed.agent == f"worker-{meta['thread_id']}"  # no spawn call matched: the thread's own name
    named = route_identity({**headers, "x-grove-agent": "critic"}, [], None, view)
    assert named.agent == "critic" and named.session_id is None


@pytest.mark.parametrize(
    "value", ["not json", "[]", json.dumps({"window_number": 0}), json.dumps({"thread_id": "a b"}),
              json.dumps({"thread_id": "t", "window_number": -1})],
)  # fmt: skip
def test_unreadable_metadata_is_refused(value):
    with pytest.raises(InvalidCodexMetadataError, match=TURN_METADATA_HEADER):
        identify({TURN_METADATA_HEADER: value}, [], None, set())
