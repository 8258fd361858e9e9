"""The Anthropic Messages wire format: its error shape and the rendering of a captured call.

A call's chat record (capture/records.py) comes back as a `message`: a `text` block with the generated
text (none when empty), one `tool_use` block per tool call (`id` = the call's tool-call id, `input` =
its generated arguments parsed), `stop_reason` `tool_use` / `max_tokens` / `end_turn`, and `usage` with
the call's real prompt and completion token counts (Claude Code decides compaction from
`input_tokens`). Streamed, the same content as Anthropic's event sequence: `message_start`, `ping`,
per block `content_block_start` / `content_block_delta` (`text_delta`; `input_json_delta` carrying the
generated arguments text as it was generated) / `content_block_stop`, `message_delta` (stop reason,
usage), and `message_stop`, the last part (its delivery is what gets recorded).

Refusals: `{"type": "error", "error": {"type", "message"}}`, a stream's as an `error` event. Anthropic's
types and statuses: 503 is `overloaded_error` with status 529 (what a chat client gets as 503), 413
`request_too_large`, other server errors `api_error`; a context-length refusal starts with "prompt is
too long" as Anthropic's does (Claude Code compacts on it).

Its request is gateway/intake/messages_request.py, its route gateway/http/routes/anthropic.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from starlette.responses import JSONResponse

from capture.records import ChatRecord
from gateway.http.wire.refusal import ErrorShape, Refusal
from gateway.intake.context_window import OPENAI_CODE
from gateway.intake.messages_request import MessagesRequest

OVERLOADED = 529  # Anthropic's status for "try again later"
_KINDS = {  # OpenAI's error types -> Anthropic's
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "conflict_error": "invalid_request_error",  # Anthropic has no conflict type; the status says 409
}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # anything else ended the turn


class UnrenderableToolCallError(Exception):
    """A generated tool call whose arguments are not a JSON object: a `tool_use` block cannot carry them
    exactly (HTTP 502 through the route; the call is not delivered)."""


class AnthropicErrors:
    """Refusals as the Anthropic clients read them (module docstring)."""

    def status_and_type(self, refusal: Refusal) -> tuple[int, str]:
        if refusal.status == 503:
            return OVERLOADED, "overloaded_error"
        if refusal.status == 413:
            return 413, "request_too_large"
        if refusal.status >= 500:
            return refusal.status, "api_error"
        return refusal.status, _KINDS.get(refusal.kind, "invalid_request_error")

    def body(self, refusal: Refusal) -> dict[str, Any]:
        _, kind = self.status_and_type(refusal)
        message = refusal.message
        if refusal.code == OPENAI_CODE:
            message = f"prompt is too long: {message}"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def response(self, refusal: Refusal) -> JSONResponse:
        status, _ = self.status_and_type(refusal)
        return JSONResponse(self.body(refusal), status_code=status, headers=refusal.headers)

    def event(self, refusal: Refusal) -> bytes:
        return _event("error", self.body(refusal)).encode()


ANTHROPIC_ERRORS = AnthropicErrors()


def message_id(episode_id: str, call_id: str) -> str:
    return "msg_" + hashlib.sha256(f"{episode_id}/{call_id}".encode()).hexdigest()[:24]


def stop_reason(record: ChatRecord) -> str:
    if record.response.get("tool_calls"):
        return "tool_use"
    return STOP_REASONS.get(record.finish_reason, "end_turn")


def usage_body(record: ChatRecord) -> dict[str, int]:
    """The call's real token counts; grove caches no prompt, so the cache counts are 0."""
    return {
        "input_tokens": record.usage.prompt_tokens,
        "output_tokens": record.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _tool_input(record: ChatRecord, call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise UnrenderableToolCallError(
            f"episode {record.episode_id!r}: call {record.call_id!r} generated a tool call "
            f"{call['function']['name']!r} whose arguments are not a JSON object ({arguments!r}); a tool_use "
            "block cannot carry them. The call is not delivered; retry the request"
        )
    return parsed


def content_blocks(record: ChatRecord) -> list[dict[str, Any]]:
    """The generated text (if any) and the tool calls as content blocks."""
    blocks: list[dict[str, Any]] = []
    text = record.response.get("content")
    if text:
        blocks.append({"type": "text", "text": text})
    for call in record.response.get("tool_calls") or []:
        name, tool_input = call["function"]["name"], _tool_input(record, call)
        blocks.append({"type": "tool_use", "id": call["id"], "name": name, "input": tool_input})
    return blocks


def message_body(record: ChatRecord, model: str) -> dict[str, Any]:
    """The non-streamed `message` object."""
    return {
        "id": message_id(record.episode_id, record.call_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(record),
        "stop_reason": stop_reason(record),
        "stop_sequence": None,
        "usage": usage_body(record),
    }


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _block_events(index: int, block: dict[str, Any], record: ChatRecord) -> Iterator[str]:
    start: dict[str, Any]
    if block["type"] == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        arguments = next(c for c in record.response["tool_calls"] if c["id"] == block["id"])["function"]
        delta = {"type": "input_json_delta", "partial_json": arguments["arguments"]}  # as generated
    yield _event(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
    )
    yield _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
    yield _event("content_block_stop", {"type": "content_block_stop", "index": index})


def stream_events(record: ChatRecord, model: str) -> list[str]:
    """The events of a streamed answer, in order; `message_stop` last."""
    started = {**message_body(record, model), "content": [], "stop_reason": None}
    started["usage"] = {**usage_body(record), "output_tokens": 0}
    events = [_event("message_start", {"type": "message_start", "message": started})]
    events.append(_event("ping", {"type": "ping"}))
    for index, block in enumerate(content_blocks(record)):
        events.extend(_block_events(index, block, record))
    delta = {"stop_reason": stop_reason(record), "stop_sequence": None}
    events.append(
        _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_body(record)})
    )
    events.append(_event("message_stop", {"type": "message_stop"}))
    return events


class MessagesWire:
    """A captured call as an Anthropic `message` or its stream events."""

    errors: ErrorShape = ANTHROPIC_ERRORS

    def body(self, record: ChatRecord, request: MessagesRequest, model: str) -> dict[str, Any]:
        return message_body(record, model)

    def events(self, record: ChatRecord, request: MessagesRequest, model: str) -> Iterable[str]:
        return stream_events(record, model)


ANTHROPIC_MESSAGES = MessagesWire()
