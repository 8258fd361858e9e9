"""Claude Code adapter: who is calling, from what stock Claude Code (2.1.x) sends on the Anthropic
Messages API (gateway/http/routes/anthropic.py), with no grove header.

- Every request of a Claude Code run carries `x-claude-code-session-id`; a subagent's requests also
  carry `x-claude-code-agent-id: <id>`, the lead's do not. The lead is agent "parent".
- A subagent is a worker spawned by the lead's `Agent` tool call (`{description, prompt, subagent_type,
  ...}`) whose `prompt` its first request's first user message holds, and is named after that
  `subagent_type` (`researcher`, `researcher-2` when one type runs twice: the OpenCode rule,
  harnesses/opencode_agents.py `subagent_name`). Its name is derived once, at its first request, from
  the lead's recent calls, and stored (gateway/pipeline/claude_code_names.py); an agent id whose first
  message matches no `Agent` call is `worker-<agent id>`, spawned by the lead's current head.
- Compaction: the summary request is an ordinary request whose last user message asks for the summary
  ("Respond with TEXT ONLY" ... `<summary>`): the agent's auxiliary call of kind SUMMARY, in
  `<agent>~summary` (trained only when the run trains summaries). The agent's next request starts with
  "This session is being continued from a previous conversation": a rewrite the adapter declares (a new
  context for the agent) unless it extends or repeats the current head.

Pure module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
from gateway.pipeline.opencode_names import SubagentName
from grove.receipts import CallKind

SESSION_HEADER = "x-claude-code-session-id"
AGENT_ID_HEADER = "x-claude-code-agent-id"
AGENT_TOOL = "Agent"
DEFAULT_SUBAGENT_TYPE = "general-purpose"  # Claude Code's type when the call names none
SUMMARY_ASKS = ("Respond with TEXT ONLY", "<summary>")  # both in the last user message
CONTINUED = "This session is being continued from a previous conversation"


def is_claude_code(headers: Mapping[str, str]) -> bool:
    return SESSION_HEADER in headers


def agent_id(headers: Mapping[str, str]) -> str | None:
    """The subagent's id (None: the lead)."""
    return header_value(headers, AGENT_ID_HEADER)


def worker_agent(subagent_id: str) -> str:
    return f"worker-{subagent_id}"


def _user_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [text_of(m.get("content")) for m in messages if m.get("role") == "user"]


def is_summary_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Claude Code's compaction request: its last user message asks for the summary."""
    texts = _user_texts(messages)
    return bool(texts) and all(ask in texts[-1] for ask in SUMMARY_ASKS)


def is_post_compaction(messages: Sequence[Mapping[str, Any]]) -> bool:
    """The first request of an agent after its compaction: its first user message says so."""
    texts = _user_texts(messages)
    return bool(texts) and texts[0].lstrip().startswith(CONTINUED)


def agent_calls(response: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(subagent_type, prompt) of each `Agent` tool call of an assistant message, in its order."""
    calls = []
    for call in (response or {}).get("tool_calls") or ():
        fn = call.get("function") or {}
        if fn.get("name") != AGENT_TOOL:
            continue
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            continue
        if isinstance(args, dict) and isinstance(args.get("prompt"), str) and args["prompt"].strip():
            subagent_type = args.get("subagent_type")
            if not isinstance(subagent_type, str) or not subagent_type:
                subagent_type = DEFAULT_SUBAGENT_TYPE
            calls.append((subagent_type, args["prompt"]))
    return calls


def identify(
    headers: Mapping[str, str], messages: Sequence[dict[str, Any]], name: SubagentName | None
) -> Identity:
    """The identity of a Claude Code request (module docstring); `name`: the subagent's stored name (None:
    the lead, or a subagent not named yet)."""
    subagent = agent_id(headers)
    agent = DEFAULT_AGENT if subagent is None else (name.agent if name else worker_agent(subagent))
    if is_summary_request(messages):
        return auxiliary_identity(agent, CallKind.SUMMARY)
    spawner = None
    if subagent is not None:
        spawned_by = name.spawned_by if name else None
        spawner = Spawner(call_id=spawned_by) if spawned_by else Spawner(agent=DEFAULT_AGENT)
    rewrite = RewriteMode.IF_NOT_EXTENSION if is_post_compaction(messages) else RewriteMode.NONE
    return Identity(agent=agent, spawner=spawner, rewrite=rewrite)
