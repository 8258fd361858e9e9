"""Codex CLI adapter: agent identity from Codex's own turn metadata, its compaction call and the rewrite
after it (what Codex 0.171.0 sends: models/harness_text/codex_0_171_0.json).

Every Codex request carries `x-codex-turn-metadata`, a JSON object with the request's `thread_id` (one per
agent: the lead's, each subagent's), `parent_thread_id` (a subagent's spawner), `thread_source` (`user`
or `subagent`), `request_kind` (`turn` or `compaction`) and `window_number` (which context window of the
thread: it goes up by one after each compaction). So:

- The lead's thread (no parent) is agent "parent"; a subagent's thread is named like an OpenCode
  subagent (gateway/pipeline/opencode_names.py): from the lead's `spawn_agent` call whose `message` is the
  subagent's first user message, `worker` for the first, `worker-2` after, in the order the lead wrote
  the calls (the same names in a relaunch); a thread no call matches is `worker-<thread id>`. A subagent
  is spawned by the head of its parent thread's agent.
- `request_kind: compaction` is that agent's summary call: an auxiliary call of kind SUMMARY in
  `<agent>~summary` (trained when the run trains summaries).
- A turn of a window after the first opens with the summary in place of the history: a rewrite of the
  agent's context, unless it extends or repeats the current head (RewriteMode.IF_NOT_EXTENSION).

Metadata that is not a JSON object with a thread id is refused (400 InvalidCodexMetadataError) before
anything is admitted. Pure module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.pipeline.identity import (
    Identity,
    InvalidIdentityHeaderError,
    RewriteMode,
    Spawner,
    auxiliary_identity,
)
from gateway.pipeline.opencode import session_agent
from grove.receipts import CallKind

TURN_METADATA_HEADER = "x-codex-turn-metadata"
SPAWN_TOOL = "spawn_agent"  # Codex's multi_agent_v1 spawn: {"message": <the subagent's first message>, ...}
THREAD_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,96}$")


class InvalidCodexMetadataError(InvalidIdentityHeaderError):
    """An `x-codex-turn-metadata` header the gateway cannot read (not JSON, no usable thread id)."""


@dataclass(frozen=True)
class TurnMetadata:
    """The parts of Codex's turn metadata that say whose request it is and what it is."""

    thread_id: str
    parent_thread_id: str | None
    compaction: bool
    window_number: int


def _thread(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not THREAD_PATTERN.match(value):
        raise InvalidCodexMetadataError(
            f"header {TURN_METADATA_HEADER}: {field} {str(value)[:60]!r} is not accepted; expected "
            f"{THREAD_PATTERN.pattern} (Codex's thread ids are UUIDs)"
        )
    return value


def turn_metadata(headers: Mapping[str, str]) -> TurnMetadata | None:
    """The request's turn metadata, None when the header is absent."""
    raw = headers.get(TURN_METADATA_HEADER)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise InvalidCodexMetadataError(
            f"header {TURN_METADATA_HEADER} is not a JSON object; Codex sends one with thread_id, "
            "parent_thread_id, request_kind and window_number"
        )
    thread = _thread(meta.get("thread_id"), "thread_id")
    if thread is None:
        raise InvalidCodexMetadataError(f"header {TURN_METADATA_HEADER} has no thread_id")
    window = meta.get("window_number", 0)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise InvalidCodexMetadataError(
            f"header {TURN_METADATA_HEADER}: window_number {window!r} is not a count"
        )
    return TurnMetadata(
        thread_id=thread,
        parent_thread_id=_thread(meta.get("parent_thread_id"), "parent_thread_id"),
        compaction=meta.get("request_kind") == "compaction",
        window_number=window,
    )


def threads(headers: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(thread, parent thread) of a Codex request, None without (or with unreadable) turn metadata (the
    request is then refused by `identify`)."""
    try:
        meta = turn_metadata(headers)
    except InvalidCodexMetadataError:
        return None
    return None if meta is None else (meta.thread_id, meta.parent_thread_id)


def identify(
    headers: Mapping[str, str],
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None,
    known_agents: Collection[str],
    aliases: Mapping[str, str] | None = None,
) -> Identity:
    """The identity of a Codex request (module docstring); `aliases`: thread -> agent (the subagents'
    names, a relaunch's recorded agents)."""
    meta = turn_metadata(headers)
    assert meta is not None  # gateway/pipeline/routing.py dispatches here only when the header is present
    has_parent = meta.parent_thread_id is not None
    agent = session_agent(meta.thread_id, has_parent, known_agents, aliases)
    if meta.compaction:
        return auxiliary_identity(agent, CallKind.SUMMARY, meta.thread_id)
    spawner = None
    if meta.parent_thread_id is not None:
        spawner = Spawner(agent=session_agent(meta.parent_thread_id, False, known_agents, aliases))
    return Identity(
        agent=agent,
        spawner=spawner,
        rewrite=RewriteMode.IF_NOT_EXTENSION if meta.window_number > 0 else RewriteMode.NONE,
        session_id=meta.thread_id,
        # a relaunch's lead thread replays the episode's parent (gateway/pipeline/launch_records.py)
        root_session=not has_parent and not (aliases and meta.thread_id in aliases),
    )
