"""Tool calls in generated text <-> OpenAI-style `tool_calls`, for hermes-format chat templates.

Hermes format (the tiny model's template, Qwen2.5, NousResearch Hermes): the assistant turn is
optional content, then one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block per call,
separated by whitespace only. `parse_tool_calls` turns generated text into an assistant message;
`format_tool_calls` writes the canonical text of such a message (the tiny template's rendering).
The exact text *any* template renders for a message is `chat.render.assistant_turn_text`.

Model output is untrusted: anything that is not a well-formed sequence of blocks (an unclosed tag,
invalid JSON, a block without a string "name" or with non-object "arguments", non-whitespace text
between or after blocks) is returned as plain content with no tool calls, never an exception, so
the harness sees what the model wrote and the call's tokens stay the sampled ones.

Pure module (stdlib only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


@dataclass(frozen=True)
class ParsedAssistant:
    """An assistant response: content and OpenAI-style tool calls; `malformed` says why text stayed plain."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: str | None = None

    def message(self, *, with_ids: bool = True) -> dict[str, Any]:
        """The OpenAI chat message (role assistant) for this response."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            strip = () if with_ids else ("id",)
            msg["tool_calls"] = [{k: v for k, v in c.items() if k not in strip} for c in self.tool_calls]
        return msg


def _plain(text: str, why: str | None) -> ParsedAssistant:
    return ParsedAssistant(content=text, tool_calls=[], malformed=why)


def _parse_block(inner: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) of one block's JSON, or a string saying why it is malformed."""
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError as exc:
        return f"tool-call JSON does not parse ({exc.msg} at {exc.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return 'tool-call JSON is not an object with a non-empty string "name"'
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return f'tool call {obj["name"]!r}: "arguments" is not a JSON object'
    if set(obj) - {"name", "arguments"}:
        return f"tool call {obj['name']!r} has unexpected keys {sorted(set(obj) - {'name', 'arguments'})}"
    return obj["name"], arguments


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> ParsedAssistant:
    """Split generated text into content and tool calls; tool-call ids are `{id_prefix}_{i}`."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return _plain(text, None if TOOL_CALL_END not in text else "a </tool_call> without <tool_call>")
    calls: list[dict[str, Any]] = []
    pos = start
    for i, m in enumerate(_BLOCK.finditer(text, start)):
        if text[pos : m.start()].strip():
            return _plain(text, "non-whitespace text between tool-call blocks")
        parsed = _parse_block(m.group(1).strip())
        if isinstance(parsed, str):
            return _plain(text, parsed)
        name, arguments = parsed
        calls.append(
            {
                "id": f"{id_prefix}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
        pos = m.end()
    if not calls or text[pos:].strip():
        return _plain(text, "an unclosed <tool_call> or text after the last tool-call block")
    content = text[:start].rstrip()  # the template puts whitespace between content and the first block
    return ParsedAssistant(content=content or None, tool_calls=calls)


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def format_tool_calls(content: str | None, tool_calls: list[dict[str, Any]]) -> str:
    """Canonical hermes text of an assistant message, as the tiny model's template renders its body:
    content, then per call a newline (unless it is the very first thing) and one block."""
    out = content or ""
    for i, call in enumerate(tool_calls):
        fn = call.get("function", call)
        if out or i:
            out += "\n"
        name = json.dumps(fn["name"], ensure_ascii=False)
        arguments = _arguments_text(fn["arguments"])
        out += f'{TOOL_CALL_START}{{"name": {name}, "arguments": {arguments}}}{TOOL_CALL_END}'
    return out
