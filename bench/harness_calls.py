"""How valid a policy's tool calls were in one episode a stock harness drove: the tally behind
`python -m bench.harness_drive` (bench/harness_drive.py).

Input: the episode's call archive (capture/call_archive.py: every call's receipt, context and the
response message the gateway returned, parsed by the gateway's tool-call parser) and, per call, the tools
its request offered (the gateway's chat record, which the episode deletes at close: the driver keeps a
copy). The rule, the same as the held-out evaluation's (models/agent_eval.py `score_call_reply`):

- a tool call *written* is each call the gateway parsed, or each `<tool_call>` tag of a reply it could
  not parse (that reply's calls are all invalid: the harness got plain text);
- a written call is *valid* when it parsed, names a tool its request offered, carries the tool's
  required arguments, keeps any `enum` the schema declares, and, for a tool that starts an agent
  (`Agent`, `task`), names an agent type the harness offers (`Rules.agent_types`: the configured ones
  and any the harness's own text offers, such as Claude Code's `fork`); a tool may also need one of
  several arguments (`Rules.one_of`: Codex's `spawn_agent` takes `message` or `items`);
- a reply with text and no tool call is a text reply (a final answer or a subagent's report), not a
  tool call.

Subagents that ran: the episode's spawned contexts (a worker the gateway linked to the lead's call) with
at least one completed call. Pure module: no I/O.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capture.call_archive import CallArchive
from chat.toolcalls import TOOL_CALL_START
from grove.receipts import CallState, ContextOrigin

NO_RECORD = "no chat record of the request (its offered tools are unknown)"


@dataclass(frozen=True)
class Rules:
    """What the harness's configuration offers beyond the tool schemas: tool -> (parameter, the agent
    types it may name), and tool -> arguments of which at least one must be present."""

    agent_types: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    one_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class Tally:
    """Counts over one or more episodes (`add` sums them)."""

    episodes: int = 0
    episodes_ok: int = 0
    final_answers: int = 0
    calls: int = 0  # completed policy calls with a response
    lead_calls: int = 0
    text_replies: int = 0
    written: int = 0
    parsed: int = 0
    valid: int = 0
    subagents_ran: int = 0
    by_tool: Counter[str] = field(default_factory=Counter)  # "<name>" written / "<name> valid"
    invalid: Counter[str] = field(default_factory=Counter)  # why, per written call
    subagent_names: Counter[str] = field(default_factory=Counter)
    temperatures: Counter[str] = field(default_factory=Counter)  # as each call was sampled (receipt)

    def add(self, other: Tally) -> None:
        for name in ("episodes", "episodes_ok", "final_answers", "calls", "lead_calls", "text_replies",
                     "written", "parsed", "valid", "subagents_ran"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.by_tool.update(other.by_tool)
        self.invalid.update(other.invalid)
        self.subagent_names.update(other.subagent_names)
        self.temperatures.update(other.temperatures)

    def as_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if not isinstance(v, Counter)}
        data.update(
            by_tool=dict(self.by_tool),
            invalid=dict(self.invalid),
            subagents=dict(self.subagent_names),
            temperatures=dict(self.temperatures),
        )
        data["valid_share"] = round(self.valid / self.written, 3) if self.written else None
        return data


def offered(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters schema, from a chat request's function tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        if isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters") or {}
    return out


def check_call(name: str, arguments: Any, tools: Mapping[str, dict[str, Any]], rules: Rules) -> str | None:
    """None when a parsed call is valid under the rule of the module docstring, else why not."""
    if name not in tools:
        return f"{name!r} is not an offered tool"
    if not isinstance(arguments, dict):
        return f"{name!r}: arguments are not a JSON object"
    schema = tools[name]
    missing = [p for p in schema.get("required") or [] if p not in arguments]
    if missing:
        return f"{name!r}: required arguments {missing} missing"
    for param, prop in (schema.get("properties") or {}).items():
        if (
            isinstance(prop, dict)
            and "enum" in prop
            and param in arguments
            and arguments[param] not in prop["enum"]
        ):
            return f"{name!r}: {param}={arguments[param]!r} is not one of its enum"
    if name in rules.one_of and not any(p in arguments for p in rules.one_of[name]):
        return f"{name!r}: none of {list(rules.one_of[name])} given"
    if name in rules.agent_types:
        param, types = rules.agent_types[name]
        if arguments.get(param) not in types:
            return f"{name!r}: {param}={arguments.get(param)!r} is not an offered agent type {list(types)}"
    return None


def _arguments(call: dict[str, Any]) -> Any:
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw


def _tally_response(
    tally: Tally, response: dict[str, Any], tools: dict[str, dict[str, Any]] | None, rules: Rules
) -> None:
    calls = response.get("tool_calls") or []
    content = response.get("content")
    text = content if isinstance(content, str) else ""
    if not calls:
        tags = text.count(TOOL_CALL_START)
        if tags == 0:
            tally.text_replies += 1
            return
        tally.written += tags
        tally.by_tool["(unparsed)"] += tags
        tally.invalid["the reply's tool-call text does not parse (the harness got plain text)"] += tags
        return
    for call in calls:
        name = str((call.get("function") or {}).get("name"))
        tally.written += 1
        tally.parsed += 1
        tally.by_tool[name] += 1
        why = NO_RECORD if tools is None else check_call(name, _arguments(call), tools, rules)
        if why is None:
            tally.valid += 1
            tally.by_tool[f"{name} valid"] += 1
        else:
            tally.invalid[why] += 1


def tally_episode(
    archive: CallArchive,
    records: Mapping[str, dict[str, Any]],
    rules: Rules,
    *,
    ok: bool,
    final_answer: bool,
) -> Tally:
    """The tally of one episode: `records` maps call id -> its chat record (JSON) as the gateway wrote it;
    `ok`: the episode closed ok; `final_answer`: the harness reported a non-empty final answer."""
    tally = Tally(episodes=1, episodes_ok=int(ok), final_answers=int(final_answer))
    origin = {c.context_id: c.origin for c in archive.contexts}
    completed_in: Counter[str] = Counter()
    for call in archive.calls:
        if call.response is None or call.receipt.state in (CallState.FAILED, CallState.CANCELLED):
            continue
        tally.calls += 1
        completed_in[call.receipt.context_id] += 1
        if call.receipt.sampling is not None:
            tally.temperatures[f"{call.receipt.sampling.temperature:g}"] += 1
        if origin.get(call.receipt.context_id) == ContextOrigin.ROOT:
            tally.lead_calls += 1
        record = records.get(call.receipt.call_id)
        tools = offered(record.get("tools")) if record is not None else None
        _tally_response(tally, call.response, tools, rules)
    for context in archive.contexts:
        if context.origin == ContextOrigin.SPAWN and completed_in[context.context_id]:
            tally.subagents_ran += 1
            tally.subagent_names[context.agent] += 1
    return tally
