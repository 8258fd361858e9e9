"""The Anthropic Messages wire format without services: its request and blocks mapped to the policy's chat
form, its refusals (class, param, message), its message and stream rendering, and its error shape.

The expected chat messages are written out by hand from the rules in gateway/intake/messages_blocks.py,
never computed by the code under test."""

from __future__ import annotations

import json

import pytest

from capture.records import ChatRecord, Usage
from gateway.http.routes.errors import error_response, refusal_of
from gateway.http.wire.anthropic_messages import ANTHROPIC_ERRORS, message_body, stream_events
from gateway.intake.capture_request import WireFormat
from gateway.intake.chat_request import UnknownModelError
from gateway.intake.context_window import ContextLengthExceededError, MaxTokensOverContextError
from gateway.intake.limits import RequestLimits, RequestTooLargeError
from gateway.intake.messages_blocks import (
    InvalidMessagesRequestError,
    ToolUseMismatchError,
    UnsupportedBlockError,
)
from gateway.intake.messages_request import (
    UnsupportedMessagesParameterError,
    UnsupportedToolError,
    check_messages_body,
    parse_messages_request,
)
from gateway.pipeline.continuation import Move, UndeclaredDiscontinuityError, decide
from gateway.pipeline.identity import RewriteMode
from gateway.temporal.episode_client import TemporalUnavailableError
from grove.receipts import CallKind

MODEL = "grove-tiny"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "cache_control": {"type": "ephemeral"},
}
TOOL_USE = {"type": "tool_use", "id": "call_x_0", "name": "get_weather", "input": {"city": "Paris"}}


def request(messages: list, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 16, "messages": messages, **extra}


def canonical(body: dict):
    return parse_messages_request(body, MODEL).canonical()


def test_a_tool_round_trip_maps_to_chat_messages_with_system_first_and_in_place():
    body = request(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "x"}}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, TOOL_USE]},
            {"role": "system", "content": "Turn settings."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_x_0",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "text", "text": "And now?"},
                    {"type": "text", "text": "Be brief."},
                ],
            },
        ],
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        tools=[WEATHER],
        temperature=0.7,
        stream=True,
        thinking={"type": "adaptive"},
        metadata={"user_id": "u"},
        context_management={"edits": []},
        output_config={"effort": "high"},
    )
    # a tool_use answered after a system entry is still answered by the next user message: refused
    with pytest.raises(ToolUseMismatchError, match=r"messages\[2\].*call_x_0"):
        canonical(body)
    body["messages"][2:4] = [body["messages"][3], body["messages"][2]]
    got = canonical(body)
    assert got.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_x_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_x_0", "content": "sunny"},
        {"role": "user", "content": "And now?\n\nBe brief."},
        {"role": "system", "content": "Turn settings."},
    ]
    assert got.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert (got.overrides.temperature, got.overrides.max_tokens, got.stream) == (0.7, 16, True)
    assert got.wire == WireFormat.ANTHROPIC_MESSAGES


def test_an_error_result_says_so_and_a_bare_string_is_one_text_block():
    body = request(
        [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": [TOOL_USE]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_x_0", "content": "boom", "is_error": True}
                ],
            },
        ]
    )
    messages = canonical(body).messages
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_x_0", "type": "function", "function": call}],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "call_x_0", "content": "Error: boom"}


@pytest.mark.parametrize(
    ("messages", "error", "param", "says"),
    [
        (
            [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            UnsupportedBlockError,
            "messages[0].content[0].type",
            "'image'",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]},
                {"role": "user", "content": "b"},
            ],
            UnsupportedBlockError,
            "messages[1].content[0].type",
            "'thinking'",
        ),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}],
            ToolUseMismatchError,
            "messages[0].content[0].tool_use_id",
            "'nope'",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_other", "content": "x"}],
                },
            ],
            ToolUseMismatchError,
            "messages[2].content[0].tool_use_id",
            "call_x_0",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [TOOL_USE]},
                {"role": "user", "content": "no result"},
            ],
            ToolUseMismatchError,
            "messages[2].content",
            "no tool_result",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [TOOL_USE, TOOL_USE]},
                {"role": "user", "content": "b"},
            ],
            ToolUseMismatchError,
            "messages[1].content[1].id",
            "repeated",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "prefill"}],
            InvalidMessagesRequestError,
            "messages[1]",
            "prefill",
        ),
        (
            [{"role": "developer", "content": "a"}],
            InvalidMessagesRequestError,
            "messages[0].role",
            "'developer'",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}],
            UnsupportedBlockError,
            "messages[0].content[0].extra",
            "'extra'",
        ),
    ],
)
def test_bad_blocks_are_refused_with_their_class_and_param(messages, error, param, says):
    with pytest.raises(error) as refused:
        canonical(request(messages))
    assert type(refused.value) is error and refused.value.param == param
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("extra", "error", "param"),
    [
        ({"top_k": 5}, UnsupportedMessagesParameterError, "top_k"),
        ({"stop_sequences": ["\n\nHuman:"]}, UnsupportedMessagesParameterError, "stop_sequences"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            UnsupportedMessagesParameterError,
            "thinking",
        ),
        ({"tool_choice": {"type": "any"}}, UnsupportedMessagesParameterError, "tool_choice"),
        ({"frequency_penalty": 0.1}, UnsupportedMessagesParameterError, "frequency_penalty"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            UnsupportedToolError,
            "tools[0].type",
        ),
        ({"tools": [{**WEATHER, "strict": True}]}, UnsupportedToolError, "tools[0].strict"),
        ({"model": "claude-opus-4"}, UnknownModelError, "model"),
        ({"max_tokens": None}, InvalidMessagesRequestError, "max_tokens"),
        ({"temperature": True}, InvalidMessagesRequestError, "temperature"),
    ],
)
def test_parameters_the_learner_cannot_mirror_are_refused_by_name(extra, error, param):
    with pytest.raises(error) as refused:
        canonical(request([{"role": "user", "content": "hi"}], **extra))
    assert type(refused.value) is error and refused.value.param == param


def test_accepted_no_op_values_and_a_count_tokens_body_without_max_tokens():
    ok = request(
        [{"role": "user", "content": "hi"}], top_k=None, stop_sequences=[], tool_choice={"type": "auto"},
        thinking={"type": "disabled"}, service_tier="auto",
    )  # fmt: skip
    assert canonical(ok).messages == [{"role": "user", "content": "hi"}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert parse_messages_request(body, MODEL, counting=True).canonical().overrides.max_tokens is None


def test_a_body_over_the_context_or_the_caps_is_refused_before_parsing_the_rest():
    limits = RequestLimits()
    raw = json.dumps(request([{"role": "user", "content": "hi"}], max_tokens=1024)).encode()
    with pytest.raises(MaxTokensOverContextError, match="max_tokens=1024"):
        check_messages_body(raw, limits, MODEL, 1024)
    assert check_messages_body(raw, limits, MODEL, 1025).max_tokens == 1024


def record(response: dict, finish: str = "stop") -> ChatRecord:
    return ChatRecord(
        episode_id="ep/1", call_id="parent.0.c1", context_id="parent.0", agent="parent", kind=CallKind.ACTION,
        extends="parent.0.c0", messages=[{"role": "user", "content": "x"}], tools=None, response=response,
        finish_reason=finish, usage=Usage(prompt_tokens=40, completion_tokens=9), policy_version=0,
    )  # fmt: skip


TOOL_RESPONSE = {
    "role": "assistant",
    "content": "Checking.",
    "tool_calls": [
        {
            "id": "call_p_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ],
}


def test_a_tool_call_renders_as_text_and_tool_use_blocks_with_real_usage():
    body = message_body(record(TOOL_RESPONSE), MODEL)
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == MODEL
    assert (
        body["id"].startswith("msg_") and body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    )
    assert body["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_p_0", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert body["usage"] == {
        "input_tokens": 40,
        "output_tokens": 9,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    plain = message_body(record({"role": "assistant", "content": "Hi."}, finish="length"), MODEL)
    assert plain["stop_reason"] == "max_tokens" and plain["content"] == [{"type": "text", "text": "Hi."}]
    empty = message_body(record({"role": "assistant", "content": ""}), MODEL)
    assert empty["stop_reason"] == "end_turn" and empty["content"] == []


def parse_events(events: list[str]) -> list[tuple[str, dict]]:
    out = []
    for event in events:
        name, data = event.removesuffix("\n\n").split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_the_stream_is_anthropics_event_sequence_with_the_arguments_as_generated():
    events = parse_events(stream_events(record(TOOL_RESPONSE), MODEL))
    assert [name for name, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 40
    assert events[3][1] == {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Checking."},
    }
    assert events[5][1]["content_block"] == {
        "type": "tool_use",
        "id": "call_p_0",
        "name": "get_weather",
        "input": {},
    }
    assert events[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'}
    assert events[8][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[8][1]["usage"]["output_tokens"] == 9


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (TemporalUnavailableError("temporal down"), 529, "overloaded_error"),
        (RequestTooLargeError("too big"), 413, "request_too_large"),
        (UnknownModelError("no such model"), 404, "not_found_error"),
        (ToolUseMismatchError("bad id"), 400, "invalid_request_error"),
    ],
)
def test_refusals_take_anthropics_shape_and_statuses(error, status, kind):
    response = error_response(error, ANTHROPIC_ERRORS)
    assert response.status_code == status
    assert json.loads(response.body) == {"type": "error", "error": {"type": kind, "message": str(error)}}


def test_a_context_length_refusal_reads_as_anthropics_prompt_too_long():
    err = ContextLengthExceededError("This model's maximum context length is 1024 tokens.", param="messages")
    body = json.loads(error_response(err, ANTHROPIC_ERRORS).body)
    assert body["error"]["message"].startswith("prompt is too long: This model's maximum context length")
    event = ANTHROPIC_ERRORS.event(refusal_of(err))
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert json.loads(event.split(b"data: ", 1)[1]) == body


def test_a_generated_tool_call_echoed_as_tool_use_continues_and_an_edited_input_is_refused():
    """The head generated a tool call; the harness re-sends it as a tool_use block whose `input` is the
    parsed arguments. Equal as JSON (whatever the key order): the context continues (its generated
    tokens are spliced); another value: an undeclared edit of history."""
    head = record(TOOL_RESPONSE).model_copy(
        update={"messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    )

    def resent(tool_input: dict) -> list[dict]:
        tool_use = {"type": "tool_use", "id": "call_p_0", "name": "get_weather", "input": tool_input}
        result = {"type": "tool_result", "tool_use_id": "call_p_0", "content": "rain"}
        return [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, tool_use]},
            {"role": "user", "content": [result]},
        ]

    got = canonical(request(resent({"city": "Oslo"})))
    assert decide(got.messages, got.tools, head, RewriteMode.NONE).move == Move.CONTINUE
    got = canonical(request(resent({"city": "Bergen"})))
    with pytest.raises(UndeclaredDiscontinuityError) as edited:
        decide(got.messages, got.tools, head, RewriteMode.NONE)
    assert edited.value.index == 1


def test_a_continuation_must_echo_the_tool_use_ids_it_got():
    """A tool_use id other than the one the gateway returned for the generated call is an edit of history."""
    head = record(TOOL_RESPONSE).model_copy(update={"messages": [{"role": "user", "content": "Oslo?"}]})

    def resent(tool_id: str) -> list[dict]:
        tool_use = {"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {"city": "Oslo"}}
        return [
            {"role": "user", "content": "Oslo?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, tool_use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "rain"}]},
        ]

    same, other = canonical(request(resent("call_p_0"))), canonical(request(resent("toolu_other")))
    assert decide(same.messages, same.tools, head, RewriteMode.NONE).move == Move.CONTINUE
    with pytest.raises(UndeclaredDiscontinuityError) as edited:
        decide(other.messages, other.tools, head, RewriteMode.NONE)
    assert (edited.value.index, edited.value.field) == (1, "tool_calls[0].id")
