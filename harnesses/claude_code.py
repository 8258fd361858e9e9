"""Stock Claude Code as an episode's harness: its command line, its environment, and what its
`--output-format stream-json` events say the agents answered.

The harness runner (activities/harness.py) launches one `claude -p` per episode; this module is the pure
part of it (no I/O): everything here is a function of the episode and the gateway's address.

- Endpoint: `ANTHROPIC_BASE_URL` is the episode's prefix `<gateway>/episodes/<ref>` without `/v1`:
  Claude Code appends `/v1/messages?beta=true` itself. The episode's token goes in
  `ANTHROPIC_AUTH_TOKEN`, which Claude Code sends as `Authorization: Bearer <token>`, the header the
  gateway checks on every route; `x-grove-launch: <n>` rides on every request (`ANTHROPIC_CUSTOM_HEADERS`).
- Command (`claude_argv`): `-p` with stream-json events, the served model, the family's system prompt,
  the lead's built-in tools (`--tools`, and the same list pre-approved with `--allowedTools` under
  `--permission-mode dontAsk`: nothing ever waits for a person, and a tool outside the list is refused, not
  asked about), no settings files (`--setting-sources ""`), no MCP servers (`--strict-mcp-config`), the
  family's subagents (`--agents` JSON), a session id derived from the episode (the same at every launch)
  and no session files. Not `--bare`: it drops the `Agent` tool, and with it every subagent.
- Environment (`claude_env`): only what Claude Code needs: PATH, its own HOME and config folder under the
  launch's folder (nothing of the user's ~/.claude is read), its offline switches (no telemetry, no
  update checks, no other traffic than `/v1/messages`), no built-in subagents (only the family's appear
  in the `Agent` tool's list), no thinking request field, no per-request billing line in the system
  prompt nor attribution reminder in the first message, `max_tokens` from the run's sampling and,
  optionally, the context size at which it compacts.
- Outcome (`outcome_of_events`): the final answer is the last successful `result` event's text (an error
  result's text is Claude Code's message, the failure); each `Agent` call's
  subagent report comes from its `task_notification` (or the subagent's last text), named after its
  `subagent_type`, indexed when the type ran before (`worker`, `worker-2`: harnesses/opencode_agents.py),
  in the order the lead wrote the calls.

A task family plugs in with `TASK_SETUPS[family] = fn(task) -> ClaudeCodeSetup`; `HarnessSpec.claude_code`
(grove/contracts/harness.py ClaudeCodeOptions) overrides any part of it per run.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from grove.contracts import ClaudeCodeOptions, HarnessOutcome, TaskSpec
from grove.headers import LAUNCH_HEADER
from harnesses import claude_code_delegation
from harnesses.first_message import first_message
from harnesses.opencode_agents import subagent_names
from harnesses.sandbox import SYSTEM_PATH, sandbox_env

MODEL = "grove"  # the gateway's served model id (GatewaySettings.model_name), unless told otherwise
AGENT_TOOL = "Agent"  # the tool that starts a subagent (Claude Code 2.1.x)
OFFLINE_ENV = {
    "DISABLE_TELEMETRY": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # else it also sends `HEAD /api/hello`
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_AGENT_SDK_DISABLE_BUILTIN_AGENTS": "1",  # Explore, Plan, general-purpose, ... off
    "CLAUDE_CODE_DISABLE_THINKING": "1",  # no `thinking` field: the policy's reasoning is its own text
    # no per-request billing line at the top of the system prompt, no commit-attribution reminder
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
}
# A uuid5 namespace for the session ids: the same episode gets the same session id at every launch.
SESSION_NAMESPACE = uuid.UUID("5b0e6f43-61a4-4c38-9a0e-8f1c2d3b4a5e")
_AGENT_KEYS = {"description", "prompt", "tools", "disallowedTools", "model", "effort"}
_HANDBACK = re.compile(r"The report follows:\n(?P<text>.*?)\nagentId: ", re.DOTALL)


class ClaudeCodeSetupError(ValueError):
    """A task the runner cannot set Claude Code up for (no first message, a malformed agent)."""


@dataclass(frozen=True)
class ClaudeCodeSetup:
    """What a task family gives Claude Code: the first user message, the lead's system prompt, the
    subagents (`--agents`: name -> {description, prompt, tools?}), the lead's built-in tools, and files
    for the episode's project folder (relative path -> text)."""

    message: str
    system_prompt: str
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: tuple[str, ...] = (AGENT_TOOL,)
    files: dict[str, str] = field(default_factory=dict)


def delegation_setup(task: TaskSpec) -> ClaudeCodeSetup:
    """The `claude-code-delegation` family (harnesses/claude_code_delegation.py)."""
    return ClaudeCodeSetup(
        message=claude_code_delegation.user_message(task),
        system_prompt=claude_code_delegation.LEAD_PROMPT,
        agents=claude_code_delegation.AGENTS,
        tools=claude_code_delegation.LEAD_TOOLS,
    )


TASK_SETUPS: dict[str, Callable[[TaskSpec], ClaudeCodeSetup]] = {
    claude_code_delegation.FAMILY: delegation_setup,
}


def setup_for(task: TaskSpec, options: ClaudeCodeOptions) -> ClaudeCodeSetup:
    """The task family's setup with the run's overrides; a family without one needs `message` (in the
    options or as the task's `params["message"]`)."""
    base = TASK_SETUPS[task.family](task) if task.family in TASK_SETUPS else None
    message = first_message(
        task, options.message, base.message if base else None,
        harness="Claude Code", module="claude_code", option="claude_code", error=ClaudeCodeSetupError,
    )  # fmt: skip
    system = options.system_prompt or (base.system_prompt if base else "")
    agents = options.agents if options.agents is not None else (base.agents if base else {})
    tools = tuple(options.tools) if options.tools is not None else (base.tools if base else (AGENT_TOOL,))
    setup = ClaudeCodeSetup(
        message=message, system_prompt=system, agents=agents, tools=tools,
        files=base.files if base else {},
    )  # fmt: skip
    check_setup(task, setup)
    return setup


def check_setup(task: TaskSpec, setup: ClaudeCodeSetup) -> None:
    """Every subagent has a description and a prompt (Claude Code drops one without), only keys it
    reads, and the lead can start them (`Agent` among its tools); files stay inside the project."""
    where = f"task {task.task_id!r} of family {task.family!r}"
    for name, body in setup.agents.items():
        missing = sorted({"description", "prompt"} - body.keys())
        unknown = sorted(body.keys() - _AGENT_KEYS)
        if missing or unknown or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ClaudeCodeSetupError(
                f"{where}: subagent {name!r}: expected a name of letters, digits, '-' or '_' and the keys "
                f"description and prompt (optional: {sorted(_AGENT_KEYS - {'description', 'prompt'})}); "
                f"missing {missing}, unknown {unknown}"
            )
    if setup.agents and AGENT_TOOL not in setup.tools:
        raise ClaudeCodeSetupError(
            f"{where}: subagents {sorted(setup.agents)} are defined but the lead's tools {list(setup.tools)} "
            f"lack {AGENT_TOOL!r}, so it could never start them; add it to harness.claude_code.tools"
        )
    for path in setup.files:
        parts = PurePosixPath(path).parts
        if not parts or PurePosixPath(path).is_absolute() or ".." in parts or parts[0] == ".claude":
            raise ClaudeCodeSetupError(
                f"{where}: project file {path!r}: expected a relative path inside the project folder (no "
                "'..', nothing under .claude/); fix the family's setup"
            )


def anthropic_base_url(episode_v1_url: str) -> str:
    """`ANTHROPIC_BASE_URL` for the episode whose chat-completions base is `episode_v1_url`
    (`.../episodes/<ref>/v1`): the same prefix without `/v1`, which Claude Code appends itself."""
    url = episode_v1_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def session_id(episode_id: str) -> str:
    """The Claude Code session id of an episode: the same at every launch of it."""
    return str(uuid.uuid5(SESSION_NAMESPACE, episode_id))


def allowed_tools(setup: ClaudeCodeSetup) -> list[str]:
    """The tools approved up front: the lead's and every subagent's (sorted, each once)."""
    names = set(setup.tools)
    for body in setup.agents.values():
        names.update(body.get("tools") or [])
    return sorted(names)


def claude_argv(binary: str, setup: ClaudeCodeSetup, *, model: str, episode_id: str) -> list[str]:
    """One headless run (see the module docstring); the first message goes last, after `--`, so that
    a message starting with '-' is never read as an option."""
    return [
        binary, "-p", "--output-format", "stream-json", "--verbose",
        "--model", model,
        "--system-prompt", setup.system_prompt,
        "--tools", ",".join(setup.tools),
        "--allowedTools", ",".join(allowed_tools(setup)),
        "--permission-mode", "dontAsk",
        "--setting-sources", "",
        "--strict-mcp-config",
        "--agents", json.dumps(setup.agents, separators=(",", ":")),
        "--session-id", session_id(episode_id),
        "--no-session-persistence",
        "--", setup.message,
    ]  # fmt: skip


def claude_env(
    home: str,
    base_url: str,
    token: str,
    *,
    launch: int,
    max_output_tokens: int,
    request_timeout_s: float,
    max_context_tokens: int | None = None,
    path: str = SYSTEM_PATH,
) -> dict[str, str]:
    """The whole environment of a Claude Code process (module docstring); `base_url`: the episode's
    prefix without `/v1` (`anthropic_base_url`). `request_timeout_s`: how long Claude Code waits for one
    response before it re-sends the request (its own default is 600 s; the gateway answers when a
    generation is done, and a re-sent request would find the first still generating). `max_context_tokens`:
    Claude Code compacts a context once the input tokens the gateway reports approach it (None: its own
    default window)."""
    extra = {
        **OFFLINE_ENV,
        "CLAUDE_CONFIG_DIR": f"{home}/.claude",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": token,
        "ANTHROPIC_CUSTOM_HEADERS": f"{LAUNCH_HEADER}: {launch}",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
        "API_TIMEOUT_MS": str(max(1, round(request_timeout_s * 1000))),
    }
    if max_context_tokens is not None:
        extra["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(max_context_tokens)
    return sandbox_env(home, path, **extra)


def _blocks(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = (event.get("message") or {}).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _handback(text: str) -> str | None:
    """The subagent's report inside a foreground `Agent` call's result (each line indented by two)."""
    match = _HANDBACK.search(text)
    if match is None:
        return None
    return "\n".join(line.removeprefix("  ") for line in match.group("text").split("\n"))


def _agent_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(tool_use id, subagent_type) of the lead's `Agent` calls, in the order it wrote them."""
    calls = []
    for event in events:
        if event.get("type") == "assistant" and event.get("parent_tool_use_id") is None:
            for block in _blocks(event):
                if block.get("type") == "tool_use" and block.get("name") == AGENT_TOOL:
                    subagent_type = (block.get("input") or {}).get("subagent_type") or "general-purpose"
                    calls.append((str(block.get("id")), str(subagent_type)))
    return calls


def _reports(events: list[dict[str, Any]]) -> dict[str, str]:
    """tool_use id -> the subagent's report: its notification's report, else its last text (a subagent
    event carries the call's id as `parent_tool_use_id`), else the foreground call's hand-back text."""
    notified: dict[str, str] = {}
    last_text: dict[str, str] = {}
    handback: dict[str, str] = {}
    for event in events:
        kind, parent = event.get("type"), event.get("parent_tool_use_id")
        notice = kind == "system" and event.get("subtype") == "task_notification"
        if notice and event.get("summary_is_report"):
            notified[str(event.get("tool_use_id"))] = str(event.get("summary") or "")
        elif kind == "assistant" and parent is not None:
            text = _text((event.get("message") or {}).get("content"))
            if text:
                last_text[str(parent)] = text
        elif kind == "user" and parent is None:
            for block in _blocks(event):
                if block.get("type") == "tool_result":
                    report = _handback(_text(block.get("content")))
                    if report is not None:
                        handback[str(block.get("tool_use_id"))] = report
    return {**handback, **last_text, **notified}


def outcome_of_events(events: list[dict[str, Any]]) -> HarnessOutcome:
    """Final answer, each subagent's report and any error Claude Code reported (module docstring)."""
    results = [e for e in events if e.get("type") == "result"]
    answers = [e for e in results if e.get("subtype") == "success" and not e.get("is_error")]
    last = answers[-1] if answers else None  # an error result's text is Claude Code's, not the lead's
    final = str(last.get("result") or "") if last else ""
    outputs: dict[str, list[str]] = {"parent": [final]} if last else {}
    reports = _reports(events)
    calls = _agent_calls(events)
    for name, (call_id, _) in zip(subagent_names(t for _, t in calls), calls, strict=True):
        if call_id in reports:
            outputs[name] = [reports[call_id]]
    failure = None
    errors = [e for e in results if e.get("is_error") or e.get("subtype") != "success"]
    if errors:
        bad = errors[-1]
        detail = bad.get("result") or bad.get("errors") or bad.get("api_error_status") or bad.get("subtype")
        failure = f"Claude Code reported: {str(detail)[:500]}"
    elif not results:
        failure = "Claude Code wrote no result event"
    return HarnessOutcome(final_answer=final, outputs=outputs, failure=failure)
