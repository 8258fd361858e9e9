"""OpenCode adapter: agent identity from `x-session-id` / `x-parent-session-id`, and OpenCode's own
auxiliary calls and compaction rewrite (what OpenCode 1.18.33 sends, read from its requests and source).

- The root session (no `x-parent-session-id`, no name of a subagent) is agent "parent"; a child session is the
  agent named after its agent type (`researcher`, `researcher-2`: gateway/pipeline/opencode_names.py names it
  at its first request and passes the names in as `aliases`), spawned by the head of its parent session's
  agent's current context. A session without a name that has a parent is `worker-<session>`.
- Title calls ("You are a title generator...") and compaction-summary calls ("You are a context
  summarization agent...") have no tools and reuse their session's id: they are auxiliary calls of
  kind TITLE in `<agent>~title` and SUMMARY (the summary of that agent's context, trainable) in
  `<agent>~summary`, contexts of their own. A subagent's summary call lacks
  `x-parent-session-id`; it is still the subagent's, because its session has a name.
- After a compaction the session's next request is `[system..., user "What did we do so far?",
  assistant <summary>, user "Continue if you have next steps..."]` (without the assistant message when
  the summary was empty): a rewrite the adapter declares (a new context for the agent), unless it
  extends or repeats the current head.

Pure module.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from chat.message_text import text_of
from gateway.pipeline.identity import (
    DEFAULT_AGENT,
    Identity,
    RewriteMode,
    Spawner,
    auxiliary_identity,
    header_value,
)
from grove.receipts import CallKind

SESSION_HEADER = "x-session-id"
PARENT_SESSION_HEADER = "x-parent-session-id"
TITLE_PROMPT = "You are a title generator"
SUMMARY_PROMPT = "You are a context summarization agent"
COMPACTION_QUESTION = "What did we do so far?"
COMPACTION_CONTINUE = "Continue if you have next steps"
SESSION_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,96}$")


def _leading_systems(messages: Sequence[dict[str, Any]]) -> int:
    n = 0
    while n < len(messages) and messages[n].get("role") == "system":
        n += 1
    return n


def auxiliary_kind(messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> CallKind | None:
    """TITLE or SUMMARY for OpenCode's auxiliary calls, else None."""
    if tools:
        return None
    for message in messages[: _leading_systems(messages)]:
        text = text_of(message.get("content")).lstrip()
        if text.startswith(TITLE_PROMPT):
            return CallKind.TITLE
        if text.startswith(SUMMARY_PROMPT):
            return CallKind.SUMMARY
    return None


def is_post_compaction(messages: Sequence[dict[str, Any]]) -> bool:
    """The first request of a session after OpenCode compacted it; an empty summary is left out of it
    (OpenCode drops empty assistant messages), so `[user Q, user Continue]` is one too."""
    rest = messages[_leading_systems(messages) :]
    roles = [m.get("role") for m in rest]
    return (
        roles in (["user", "assistant", "user"], ["user", "user"])
        and text_of(rest[0].get("content")).strip() == COMPACTION_QUESTION
        and text_of(rest[-1].get("content")).lstrip().startswith(COMPACTION_CONTINUE)
    )


def worker_agent(session_id: str) -> str:
    return f"worker-{session_id}"


def session_agent(
    session_id: str, has_parent: bool, known_agents: Collection[str], aliases: Mapping[str, str] | None = None
) -> str:
    """The agent of an OpenCode session: its name in `aliases` (a subagent's,
    gateway/pipeline/opencode_names.py; the recorded agent a relaunched session replays,
    gateway/pipeline/launch_records.py), a child session's worker, else the root agent."""
    if aliases and session_id in aliases:
        return aliases[session_id]
    worker = worker_agent(session_id)
    return worker if has_parent or worker in known_agents else DEFAULT_AGENT


def identify(
    headers: Mapping[str, str],
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None,
    known_agents: Collection[str],
    aliases: Mapping[str, str] | None = None,
) -> Identity:
    session = header_value(headers, SESSION_HEADER, SESSION_PATTERN)
    parent_session = header_value(headers, PARENT_SESSION_HEADER, SESSION_PATTERN)
    assert session is not None  # identity.identify dispatches here only when the header is present
    agent = session_agent(session, parent_session is not None, known_agents, aliases)
    kind = auxiliary_kind(messages, tools)
    if kind is not None:
        return auxiliary_identity(agent, kind, session)
    spawner = None
    if parent_session is not None:
        spawner = Spawner(agent=session_agent(parent_session, False, known_agents, aliases))
    return Identity(
        agent=agent,
        spawner=spawner,
        rewrite=RewriteMode.IF_NOT_EXTENSION if is_post_compaction(messages) else RewriteMode.NONE,
        session_id=session,
        # a relaunch's root session replays the episode's parent (gateway/pipeline/launch_records.py): no
        # foreign-session check
        root_session=agent == DEFAULT_AGENT and not (aliases and session in aliases),
    )
