"""Anthropic Messages content blocks -> the policy's chat form (gateway/intake/capture_request.py).

The rules, each deterministic (a harness that re-sends its history gets the same chat messages, so
continuation and the exact splice work as for chat completions):

- `system` (a string or text blocks) is the first message, role `system`; `role: "system"` entries
  inside `messages` (Claude Code's environment and per-turn settings) stay system messages in place;
- several text blocks of one message are one text, joined by a blank line; `cache_control` and
  `citations` are ignored (they change nothing the policy reads);
- an assistant message's text blocks are its `content` (None without text) and its `tool_use` blocks its
  `tool_calls`, `arguments` = the `input` as JSON text. The exact tokens the policy generated are what a
  continuation splices (chat/render.py): an `input` equal as JSON to the generated arguments continues
  the context, any other is an edit of history and is refused like the chat path refuses one;
- a user message's `tool_result` blocks are `tool` messages (`tool_call_id` = `tool_use_id`), in order,
  and its text a `user` message after them; `is_error: true` puts `Error: ` in front of the result's
  text (the chat template has no field for it). Every `tool_result` must answer a `tool_use` of the
  assistant message right before it, and every `tool_use` followed by a user message must be answered
  there;
- anything else (images, documents, thinking blocks, server tools, search results) is refused: the
  served model reads text, and grove never generated such a block.

Pure module.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.intake.capture_request import RequestError

TEXT_SEPARATOR = "\n\n"
ERROR_PREFIX = "Error: "
ROLES = frozenset({"user", "assistant", "system"})
_USER_BLOCKS = frozenset({"text", "tool_result"})
_ASSISTANT_BLOCKS = frozenset({"text", "tool_use"})
_IGNORED_BLOCK_KEYS = frozenset({"cache_control", "citations"})


class MessagesRequestError(RequestError):
    """Base of bad Anthropic Messages requests (HTTP 400, `invalid_request_error`)."""


class InvalidMessagesRequestError(MessagesRequestError):
    """A body that is not a valid Messages request (missing or malformed fields, bad roles)."""


class UnsupportedBlockError(MessagesRequestError):
    """A content block the served (text-only) model or grove's capture cannot take."""


class ToolUseMismatchError(MessagesRequestError):
    """A `tool_result` that answers no `tool_use` of the assistant message before it, a `tool_use`
    left unanswered by the next user message, or a repeated `tool_use` id."""


def chat_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's conversation in the policy's chat form (module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _text_of(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    pending: set[str] = set()  # tool_use ids of the last assistant message, not yet answered
    for i, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{i}]"
        if role == "assistant":
            _check_answered(pending, where)
            converted, pending = _assistant(message.get("content"), where)
            out.append(converted)
        elif role == "user":
            out.extend(_user(message.get("content"), where, pending))
            pending = set()
        elif role == "system":
            _check_answered(pending, where)
            pending = set()
            out.append({"role": "system", "content": _text_of(message.get("content"), f"{where}.content")})
        else:
            raise InvalidMessagesRequestError(
                f"{where}.role is {role!r}; expected one of {sorted(ROLES)}", param=f"{where}.role"
            )
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic tool definitions as chat `function` tools (`input_schema` -> `parameters`); a tool with
    `defer_loading: true` is left out (Anthropic puts it in the prompt only once a tool search found it,
    and grove runs no tool search)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        if tool.get("defer_loading"):
            continue
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return out or None


def _check_answered(pending: set[str], where: str) -> None:
    if pending:
        raise ToolUseMismatchError(
            f"{where}: the tool_use blocks {sorted(pending)} of the assistant message before it have no "
            "tool_result; answer every tool_use in the next user message",
            param=where,
        )


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """The message's blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise InvalidMessagesRequestError(
            f"{where}.content must be a string or a list of content blocks", param=f"{where}.content"
        )
    return content


def _text_of(content: Any, where: str) -> str:
    """The text of a string or a list of text blocks; any other block is refused."""
    texts = []
    for j, block in enumerate(_blocks(content, where)):
        if block.get("type") != "text":
            raise _unsupported(block, f"{where}[{j}]", "only text blocks are accepted here")
        texts.append(_block_text(block, f"{where}[{j}]"))
    return TEXT_SEPARATOR.join(texts)


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidMessagesRequestError(f"{where} is a text block without a string 'text'", param=where)
    _check_keys(block, {"type", "text"}, where)
    return text


def _check_keys(block: dict[str, Any], known: set[str], where: str) -> None:
    unknown = set(block) - known - _IGNORED_BLOCK_KEYS
    if unknown:
        raise UnsupportedBlockError(
            f"{where} ({block.get('type')!r} block) has fields {sorted(unknown)} the grove gateway does not "
            f"take; accepted: {sorted(known | _IGNORED_BLOCK_KEYS)}",
            param=f"{where}.{sorted(unknown)[0]}",
        )


def _unsupported(block: dict[str, Any], where: str, why: str) -> UnsupportedBlockError:
    return UnsupportedBlockError(
        f"{where} is a content block of type {block.get('type')!r}: {why}. The grove gateway serves a "
        "text-only policy and takes text, tool_use and tool_result blocks; send text instead",
        param=f"{where}.type",
    )


def _assistant(content: Any, where: str) -> tuple[dict[str, Any], set[str]]:
    """The assistant message in chat form, and the ids of its tool_use blocks."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    ids: set[str] = set()
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind not in _ASSISTANT_BLOCKS:
            raise _unsupported(block, at, "an assistant message holds the text and tool_use grove generated")
        if kind == "text":
            texts.append(_block_text(block, at))
            continue
        call = _tool_call(block, at)
        if call["id"] in ids:
            raise ToolUseMismatchError(f"{at}: tool_use id {call['id']!r} is repeated", param=f"{at}.id")
        ids.add(call["id"])
        calls.append(call)
    message: dict[str, Any] = {"role": "assistant", "content": TEXT_SEPARATOR.join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message, ids


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    _check_keys(block, {"type", "id", "name", "input"}, where)
    tool_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(tool_id, str) or not tool_id or not isinstance(name, str) or not name:
        raise InvalidMessagesRequestError(
            f"{where}: a tool_use block needs a non-empty string 'id' and 'name'", param=where
        )
    if not isinstance(arguments, dict):
        raise InvalidMessagesRequestError(f"{where}.input must be a JSON object", param=f"{where}.input")
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": tool_id, "type": "function", "function": {"name": name, "arguments": text}}


def _user(content: Any, where: str, pending: set[str]) -> list[dict[str, Any]]:
    """The user message as tool messages (its tool_result blocks) then a user message (its text)."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    answered: set[str] = set()
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind not in _USER_BLOCKS:
            raise _unsupported(block, at, "a user message takes text and tool_result blocks")
        if kind == "text":
            texts.append(_block_text(block, at))
            continue
        if texts:
            out.append({"role": "user", "content": TEXT_SEPARATOR.join(texts)})
            texts = []
        out.append(_tool_message(block, at, pending, answered))
    if pending - answered:
        raise ToolUseMismatchError(
            f"{where}: the tool_use blocks {sorted(pending - answered)} of the assistant message before it "
            "have no tool_result here; answer every tool_use in the next user message",
            param=f"{where}.content",
        )
    if texts:
        out.append({"role": "user", "content": TEXT_SEPARATOR.join(texts)})
    return out


def _tool_message(block: dict[str, Any], where: str, pending: set[str], answered: set[str]) -> dict[str, Any]:
    _check_keys(block, {"type", "tool_use_id", "content", "is_error"}, where)
    tool_use_id = block.get("tool_use_id")
    if tool_use_id not in pending or tool_use_id in answered:
        raise ToolUseMismatchError(
            f"{where}: tool_result for tool_use_id {tool_use_id!r} answers no tool_use of the assistant "
            f"message right before it (its tool_use ids: {sorted(pending)}"
            f"{', already answered' if tool_use_id in answered else ''})",
            param=f"{where}.tool_use_id",
        )
    answered.add(tool_use_id)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidMessagesRequestError(f"{where}.is_error must be a boolean", param=f"{where}.is_error")
    content = block.get("content", "")
    text = _text_of(content, f"{where}.content") if content else ""
    return {"role": "tool", "tool_call_id": tool_use_id, "content": (ERROR_PREFIX if is_error else "") + text}
