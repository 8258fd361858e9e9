"""OpenAI chat-completions responses for a finished call: one `chat.completion` object, or the same
content as `chat.completion.chunk` server-sent events.

The call has finished before the first byte is sent (generation runs in the episode workflow), so
streaming sends: the role, the content, one chunk per tool call, the finish reason, then a usage
chunk (`choices: []`) when `stream_options.include_usage` asks for it (OpenCode decides compaction
from these numbers: they are the call's real prompt and completion token counts), then
`data: [DONE]`.

Pure module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from capture.records import ChatRecord

SSE_DONE = "data: [DONE]\n\n"


def completion_id(episode_id: str, call_id: str) -> str:
    return "chatcmpl-" + hashlib.sha256(f"{episode_id}/{call_id}".encode()).hexdigest()[:24]


def finish_reason(record: ChatRecord) -> str:
    return "tool_calls" if record.response.get("tool_calls") else record.finish_reason


def usage_body(record: ChatRecord) -> dict[str, int]:
    u = record.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def completion_body(record: ChatRecord, model: str, created: int) -> dict[str, Any]:
    """The non-streaming `chat.completion` object."""
    return {
        "id": completion_id(record.episode_id, record.call_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": record.response, "finish_reason": finish_reason(record), "logprobs": None}
        ],
        "usage": usage_body(record),
    }


def _chunk(record: ChatRecord, model: str, created: int, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": completion_id(record.episode_id, record.call_id),
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }


def _deltas(record: ChatRecord) -> Iterator[dict[str, Any]]:
    yield {"role": "assistant", "content": ""}
    content = record.response.get("content")
    if content:
        yield {"content": content}
    for i, call in enumerate(record.response.get("tool_calls") or []):
        yield {"tool_calls": [{"index": i, **call}]}


def stream_chunks(record: ChatRecord, model: str, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """The chunk objects of a streamed response, in order (without the final [DONE])."""
    chunks = [
        _chunk(record, model, created, [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}])
        for d in _deltas(record)
    ]
    last = {"index": 0, "delta": {}, "finish_reason": finish_reason(record), "logprobs": None}
    chunks.append(_chunk(record, model, created, [last]))
    if include_usage:
        for chunk in chunks:
            chunk["usage"] = None  # OpenAI's shape: usage only on the final, choice-less chunk
        chunks.append({**_chunk(record, model, created, []), "usage": usage_body(record)})
    return chunks


def sse_events(chunks: list[dict[str, Any]]) -> Iterator[str]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield SSE_DONE
