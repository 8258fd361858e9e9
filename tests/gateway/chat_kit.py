"""Chat records and messages the gateway's unit tests share."""

from __future__ import annotations

from capture.records import ChatRecord, Usage
from grove.receipts import CallKind

SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Read a.txt"}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def record(messages, response, tools=None, call_id="parent.0.c0", extends=None) -> ChatRecord:
    return ChatRecord(
        episode_id="ep/1", call_id=call_id, context_id="parent.0", agent="parent", kind=CallKind.ACTION,
        extends=extends, messages=messages, tools=tools, response=response, finish_reason="stop",
        usage=Usage(prompt_tokens=10, completion_tokens=3), policy_version=0,
    )  # fmt: skip


TOOL_RESPONSE = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_x_0",
            "type": "function",
            "function": {"name": "read", "arguments": '{"path": "a.txt", "n": 2}'},
        }
    ],
}
