"""OpenCode subagents named after their agent type: `researcher`, `critic`, and `researcher-2` when one
type runs twice, in the ledger's contexts, the rows, the summary and the UI. Codex's subagents are named
by the same rule from the lead's `spawn_agent` calls (their `message` is the subagent's first user
message; the type is `worker`), their threads standing for sessions (gateway/pipeline/codex.py).

OpenCode's requests say nothing of the agent type (headers: `x-session-id`, `x-parent-session-id` and
the user agent only; OpenCode 1.18.33's provider code). The type is in the parent's response: the
`task` tool call that started the subagent, `{"description", "prompt", "subagent_type"}`, whose
`prompt` is, verbatim, the first user message of the subagent session's first request. So a new child
session is named from the call that spawned it (the head of its parent session's agent, the call the
gateway already links the spawn to):

- its type: the `subagent_type` of the spawning response's `task` call whose `prompt` is the session's
  first user message (the first such call not yet claimed by another session of that call);
- its index: 1 + the number of sessions of that type started by *other* calls before + the call's
  position among the spawning response's `task` calls of that type. The name is the type for index 1,
  `<type>-<index>` after (harnesses/opencode_agents.py: the runner names the outcome's answers so too).

The name depends only on what the model wrote (the order of the `task` calls in its responses), never on which
subagent session's request reaches the gateway first, so two concurrent subagents of one type get the same
names in every launch: a relaunched OpenCode (gateway/pipeline/launch_records.py) sees the same names. A
session whose first message matches no `task` call (another OpenCode version, a subagent started otherwise)
keeps the name `worker-<session id>`.

Each session's name is stored once, at its first request (`staging/{episode}/opencode/{session}`: the
agent, its type, the spawning call and position), and read by its later requests (its summary call
lacks `x-parent-session-id`). Names are canonical agent ids (the gateway's `canonical_agent` rule).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from capture.records import ChatRecord
from chat.message_text import text_of
from gateway.pipeline import codex
from gateway.pipeline.identity import DEFAULT_AGENT
from gateway.pipeline.opencode import PARENT_SESSION_HEADER, SESSION_HEADER, worker_agent
from grove.headers import AGENT_HEADER, CONTEXT_HEADER
from grove.store_layout import opencode_name_key, opencode_names_prefix
from harnesses.opencode_agents import subagent_name
from storage.base import ObjectNotFoundError, ObjectStore, PutOutcome

TASK_TOOL = "task"
CODEX_SUBAGENT_TYPE = "worker"  # Codex's spawn_agent names no agent type: its subagents are workers
_SESSION = re.compile(r"^[A-Za-z0-9_-]{1,96}$")


class SubagentName(BaseModel):
    """A subagent session's agent: its name and what it was derived from (None: no `task` call matched)."""

    agent: str
    subagent_type: str | None = None
    spawned_by: str | None = None
    position: int | None = None  # among the spawning response's `task` calls of this type, from 1


def task_calls(response: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(subagent_type, prompt) of each call that starts a subagent in an assistant message, in its order:
    OpenCode's `task` calls, and Codex's `spawn_agent` calls (type `worker`, prompt its `message`)."""
    calls = []
    for call in (response or {}).get("tool_calls") or ():
        fn = call.get("function") or {}
        if fn.get("name") not in (TASK_TOOL, codex.SPAWN_TOOL):
            continue
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            continue
        if not isinstance(args, dict):
            continue
        if fn["name"] == codex.SPAWN_TOOL and isinstance(args.get("message"), str):
            calls.append((CODEX_SUBAGENT_TYPE, args["message"]))
        elif isinstance(args.get("subagent_type"), str) and args["subagent_type"]:
            calls.append((args["subagent_type"], text_of(args.get("prompt"))))
    return calls


def first_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    return next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), None)


def derive(
    session_id: str,
    messages: Sequence[Mapping[str, Any]],
    spawning: ChatRecord | None,
    others: Sequence[SubagentName],
) -> SubagentName:
    """The name of a new child session (module docstring); `others`: the names of the episode's other
    subagent sessions so far."""
    asked = first_user_text(messages)
    if spawning is None or asked is None:
        return SubagentName(agent=worker_agent(session_id))
    taken = {(o.subagent_type, o.position) for o in others if o.spawned_by == spawning.call_id}
    positions: dict[str, int] = {}
    for subagent_type, prompt in task_calls(spawning.response):
        positions[subagent_type] = position = positions.get(subagent_type, 0) + 1
        if prompt.strip() != asked.strip() or (subagent_type, position) in taken:
            continue
        before = {
            o.agent for o in others if o.subagent_type == subagent_type and o.spawned_by != spawning.call_id
        }
        return SubagentName(
            agent=subagent_name(subagent_type, len(before) + position),
            subagent_type=subagent_type,
            spawned_by=spawning.call_id,
            position=position,
        )
    return SubagentName(agent=worker_agent(session_id))


def load_name(store: ObjectStore, episode_id: str, session_id: str) -> SubagentName | None:
    try:
        return SubagentName.model_validate_json(store.get(opencode_name_key(episode_id, session_id)))
    except ObjectNotFoundError:
        return None


def load_names(store: ObjectStore, episode_id: str) -> dict[str, SubagentName]:
    """Every named subagent session of the episode: session id -> its name."""
    prefix = opencode_names_prefix(episode_id)
    out = {}
    for key in store.list(prefix):
        name = load_name(store, episode_id, key[len(prefix) :])
        if name is not None:
            out[key[len(prefix) :]] = name
    return out


def save_name(store: ObjectStore, episode_id: str, session_id: str, name: SubagentName) -> SubagentName:
    """Store the session's name once; a name stored before (a concurrent first request) wins."""
    key = opencode_name_key(episode_id, session_id)
    if store.put_if_absent(key, name.model_dump_json().encode()) == PutOutcome.WRITTEN:
        return name
    return SubagentName.model_validate_json(store.get(key))


def opencode_sessions(headers: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(session, parent session) of a request OpenCode's adapter identifies (gateway/pipeline/routing.py: no
    grove agent/context header), or (thread, parent thread) of one Codex's adapter identifies
    (gateway/pipeline/codex.py), else None."""
    if AGENT_HEADER in headers or CONTEXT_HEADER in headers:
        return None
    if SESSION_HEADER not in headers and codex.TURN_METADATA_HEADER in headers:
        return codex.threads(headers)
    session = (headers.get(SESSION_HEADER) or "").strip()
    parent = (headers.get(PARENT_SESSION_HEADER) or "").strip() or None
    if not _SESSION.match(session) or (parent is not None and not _SESSION.match(parent)):
        return None  # gateway/pipeline/opencode.py refuses such headers with its own error
    return session, parent


async def session_names(
    store: ObjectStore,
    episode_id: str,
    headers: Mapping[str, str],
    messages: Sequence[Mapping[str, Any]],
    spawning_head: Callable[[str], Awaitable[str | None]],
    load_record: Callable[[str], Awaitable[ChatRecord | None]],
    aliases: Mapping[str, str],
) -> dict[str, str]:
    """Session id -> agent for an OpenCode request's own session and its parent session: `aliases` (a
    relaunch's sessions -> the recorded agents they replay, gateway/pipeline/launch_records.py), else their
    stored names; the request's own session is named (and its name stored) when it is a child session seen for
    the first time. `spawning_head`: fn(parent agent) -> the call that spawns its workers now (its current
    context's head) or None. Sessions without a name are the root's (gateway/pipeline/opencode.py)."""
    sessions = opencode_sessions(headers)
    if sessions is None:
        return dict(aliases)
    names = dict(aliases)
    for sid in (s for s in sessions if s is not None and s not in aliases):  # one read each, no listing
        found = await asyncio.to_thread(load_name, store, episode_id, sid)
        if found is not None:
            names[sid] = found.agent
    session, parent = sessions
    if session not in names and parent is not None:  # a new subagent session: name it once
        head = await spawning_head(names.get(parent, DEFAULT_AGENT))
        spawning = await load_record(head) if head else None
        others = await asyncio.to_thread(load_names, store, episode_id)
        name = derive(session, messages, spawning, list(others.values()))
        names[session] = (await asyncio.to_thread(save_name, store, episode_id, session, name)).agent
    return names
