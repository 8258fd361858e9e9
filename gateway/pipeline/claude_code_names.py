"""Claude Code subagents named after their `subagent_type`, from the lead's `Agent` call that started
them (gateway/pipeline/claude_code.py states the rule; the naming is OpenCode's,
gateway/pipeline/opencode_names.py).

A subagent's first request is named once and the name stored at
`staging/{episode}/claude-code/{agent id}` (grove/store_layout.py; the agent, its type, the spawning
call and its position); its later requests, its summary call included, read it. The spawning call is
looked for among the lead's last `LOOKBACK` calls of its current context, newest first: a background
subagent's first request may come after the lead's next call started (Claude Code answers the lead
"Async agent launched" at once).
The match is the `Agent` call whose `prompt` the subagent's first user message holds, the first such
call of that response not claimed by another subagent.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from capture.records import ChatRecord
from chat.message_text import text_of
from gateway.pipeline.claude_code import agent_calls, agent_id, worker_agent
from gateway.pipeline.identity import DEFAULT_AGENT
from gateway.pipeline.opencode_names import SubagentName
from grove.store_layout import claude_code_name_key, claude_code_names_prefix
from harnesses.opencode_agents import subagent_name
from storage.base import ObjectNotFoundError, ObjectStore, PutOutcome

LOOKBACK = 8  # the lead's calls searched for the spawning `Agent` call
_CALL = re.compile(r"^(?P<context>.+)\.c(?P<n>\d+)(\.r\d+)?$")


def first_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    return next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), None)


def derive(
    subagent_id: str,
    messages: Sequence[Mapping[str, Any]],
    spawners: Sequence[ChatRecord],
    others: Sequence[SubagentName],
) -> SubagentName:
    """The name of a new subagent (module docstring); `spawners`: the lead's recent calls, newest first;
    `others`: the names of the episode's other subagents so far."""
    asked = first_user_text(messages)
    if asked is None:
        return SubagentName(agent=worker_agent(subagent_id))
    for spawning in spawners:
        taken = {(o.subagent_type, o.position) for o in others if o.spawned_by == spawning.call_id}
        positions: dict[str, int] = {}
        for subagent_type, prompt in agent_calls(spawning.response):
            positions[subagent_type] = position = positions.get(subagent_type, 0) + 1
            if prompt.strip() not in asked or (subagent_type, position) in taken:
                continue
            before = {
                o.agent
                for o in others
                if o.subagent_type == subagent_type and o.spawned_by != spawning.call_id
            }
            return SubagentName(
                agent=subagent_name(subagent_type, len(before) + position),
                subagent_type=subagent_type,
                spawned_by=spawning.call_id,
                position=position,
            )
    return SubagentName(agent=worker_agent(subagent_id))


def load_name(store: ObjectStore, episode_id: str, subagent_id: str) -> SubagentName | None:
    try:
        return SubagentName.model_validate_json(store.get(claude_code_name_key(episode_id, subagent_id)))
    except ObjectNotFoundError:
        return None


def load_names(store: ObjectStore, episode_id: str) -> list[SubagentName]:
    prefix = claude_code_names_prefix(episode_id)
    found = (load_name(store, episode_id, key[len(prefix) :]) for key in store.list(prefix))
    return [name for name in found if name is not None]


def save_name(store: ObjectStore, episode_id: str, subagent_id: str, name: SubagentName) -> SubagentName:
    """Store the subagent's name once; a name stored before (a concurrent first request) wins."""
    key = claude_code_name_key(episode_id, subagent_id)
    if store.put_if_absent(key, name.model_dump_json().encode()) == PutOutcome.WRITTEN:
        return name
    return SubagentName.model_validate_json(store.get(key))


async def recent_calls(
    head: str | None, load_record: Callable[[str], Awaitable[ChatRecord | None]]
) -> list[ChatRecord]:
    """The records of the lead's last LOOKBACK calls of its current context, newest first (a head still
    generating has none yet)."""
    match = _CALL.match(head or "")
    if match is None:
        return []
    context, n = match["context"], int(match["n"])
    records = [await load_record(f"{context}.c{k}") for k in range(n, max(-1, n - LOOKBACK), -1)]
    return [r for r in records if r is not None]


async def subagent_name_of(
    store: ObjectStore,
    episode_id: str,
    headers: Mapping[str, str],
    messages: Sequence[Mapping[str, Any]],
    lead_head: Callable[[str], Awaitable[str | None]],
    load_record: Callable[[str], Awaitable[ChatRecord | None]],
) -> SubagentName | None:
    """The stored name of the request's subagent, named (and stored) at its first request; None for the
    lead. `lead_head`: fn(agent) -> the head of its current context."""
    subagent = agent_id(headers)
    if subagent is None:
        return None
    found = await asyncio.to_thread(load_name, store, episode_id, subagent)
    if found is not None:
        return found
    spawners = await recent_calls(await lead_head(DEFAULT_AGENT), load_record)
    others = await asyncio.to_thread(load_names, store, episode_id)
    name = derive(subagent, messages, spawners, others)
    return await asyncio.to_thread(save_name, store, episode_id, subagent, name)
