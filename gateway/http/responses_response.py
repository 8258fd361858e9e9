"""OpenAI Responses API answers for a finished call: one `response` object, or the same output as the
Responses server-sent event sequence.

The generated turn (an assistant message: text and tool calls) becomes output items in order: the text as
one `message` item with one `output_text` part (omitted when the turn has calls and no text; kept, empty,
when it has neither), then one item per tool call, written back by the request's tool routes
(gateway/intake/responses_chat.py `call_item`: `function_call` with its `namespace`, or
`custom_tool_call`). The response is `completed` even when the turn was cut at its token budget
(`finish_reason` "length"): the cut message item says `status: "incomplete"`, as the chat path answers
`finish_reason: "length"` and lets the harness go on. (A `response.incomplete` ends the turn as a failure
in Codex 0.171 and in the Agents SDK: one long reply would fail the whole episode, where the chat path's
harnesses carry on and the reward judges the reply.) `usage` holds the call's real prompt and completion
token counts (Codex compacts on them).

The call has finished before the first byte is sent (generation runs in the episode workflow), so a
stream carries each part whole, in the event grammar of the Responses API:

    response.created, response.in_progress,
    per item: response.output_item.added,
      message: response.content_part.added, response.output_text.delta, response.output_text.done,
               response.content_part.done
      function_call: response.function_call_arguments.delta, response.function_call_arguments.done
      custom_tool_call: response.custom_tool_call_input.delta, response.custom_tool_call_input.done
    response.output_item.done,
    response.completed with the whole response and its usage.

Every event is `event: <type>` + `data: <json>` with a `sequence_number` counting from 0. Ids are a pure
function of the episode and call (a replayed call answers with the same ids); the response's own id names
the call, for a later request's `previous_response_id` (gateway/intake/previous_response.py).

Pure module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from capture.records import ChatRecord
from gateway.intake.previous_response import response_id
from gateway.intake.responses_chat import ToolRoute, call_item

_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "custom_tool_call": "ctc"}


def _digest(episode_id: str, call_id: str) -> str:
    return hashlib.sha256(f"{episode_id}/{call_id}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class ResponseShape:
    """What the Responses answer of one call needs besides its record: the model id, the time, the
    request's tool routes."""

    model: str
    created_at: int
    routes: dict[str, ToolRoute]


def usage_body(record: ChatRecord) -> dict[str, Any]:
    u = record.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }


def _incomplete(record: ChatRecord) -> bool:
    return record.finish_reason == "length"


def output_items(record: ChatRecord, routes: dict[str, ToolRoute]) -> list[dict[str, Any]]:
    """The finished output items of the call's turn, ids included (module docstring)."""
    message = record.response
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    digest = _digest(record.episode_id, record.call_id)
    items: list[dict[str, Any]] = []
    if text or not calls:
        status = "incomplete" if _incomplete(record) and not calls else "completed"
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        items.append({"type": "message", "role": "assistant", "status": status, "content": [part]})
    items += [{**call_item(call, routes), "status": "completed"} for call in calls]
    for i, item in enumerate(items):
        item["id"] = f"{_ITEM_PREFIX[item['type']]}_{digest}_{i}"
    return items


def response_body(record: ChatRecord, shape: ResponseShape, status: str = "completed") -> dict[str, Any]:
    """The `response` object; `status` "in_progress" gives the empty one the stream starts with."""
    final = status == "completed"
    return {
        "id": response_id(record.episode_id, record.call_id),
        "object": "response",
        "created_at": shape.created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": shape.model,
        "output": output_items(record, shape.routes) if final else [],
        "parallel_tool_calls": True,
        "store": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage_body(record) if final else None,
    }


def _opened(item: dict[str, Any]) -> dict[str, Any]:
    """An item as `response.output_item.added` announces it: in progress, its content still empty."""
    opened = {**item, "status": "in_progress"}
    if item["type"] == "message":
        opened["content"] = []
    elif item["type"] == "function_call":
        opened["arguments"] = ""
    else:
        opened["input"] = ""
    return opened


def _item_events(item: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    yield {"type": "response.output_item.added", "output_index": index, "item": _opened(item)}
    if item["type"] == "message":
        part = item["content"][0]
        text = part["text"]
        empty = {**part, "text": ""}
        yield {"type": "response.content_part.added", **at, "content_index": 0, "part": empty}
        yield {"type": "response.output_text.delta", **at, "content_index": 0, "delta": text, "logprobs": []}
        yield {"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **at, "content_index": 0, "part": part}
    elif item["type"] == "function_call":
        arguments = item["arguments"]
        yield {"type": "response.function_call_arguments.delta", **at, "delta": arguments}
        yield {
            "type": "response.function_call_arguments.done",
            **at,
            "name": item["name"],
            "arguments": arguments,
        }
    else:
        yield {"type": "response.custom_tool_call_input.delta", **at, "delta": item["input"]}
        yield {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def stream_events(record: ChatRecord, shape: ResponseShape) -> list[dict[str, Any]]:
    """The event objects of a streamed response, in order, numbered."""
    final = response_body(record, shape)
    opening = response_body(record, shape, status="in_progress")
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(final["output"]):
        events += _item_events(item, index)
    events.append({"type": "response.completed", "response": final})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def sse_events(events: list[dict[str, Any]]) -> Iterator[str]:
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
