"""Hermes tool calls in generated text <-> OpenAI tool_calls; malformed model output stays plain content."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.render import assistant_turn_text
from chat.toolcalls import format_tool_calls, parse_tool_calls


def call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_parse_content_and_two_calls():
    text = (
        'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}</tool_call>'
    )
    parsed = parse_tool_calls(text, id_prefix="call_x")
    assert parsed.malformed is None
    assert parsed.content == "Let me check."
    assert parsed.tool_calls == [
        {
            "id": "call_x_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {
            "id": "call_x_1",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": [2, 3]}'},
        },
    ]
    assert parsed.message()["content"] == "Let me check." and len(parsed.message()["tool_calls"]) == 2


def test_plain_text_is_content():
    parsed = parse_tool_calls("The answer is 19.")
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == ("The answer is 19.", [], None)
    assert "tool_calls" not in parsed.message()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>{"name": "f", "arguments": {}}', "unclosed"),
        ('<tool_call>{"name": "f", "arguments": {}</tool_call>', "does not parse"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'non-empty string "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "not a JSON object"),
        ('<tool_call>{"name": "f", "arguments": {}, "x": 1}</tool_call>', "unexpected keys"),
        ('<tool_call>["f"]</tool_call>', 'non-empty string "name"'),
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call> and then some text', "text after"),
        (
            '<tool_call>{"name": "f"}</tool_call> x <tool_call>{"name": "g"}</tool_call>',
            "between tool-call blocks",
        ),
        ("oops </tool_call>", "without <tool_call>"),
        ("<tool_call></tool_call>", "does not parse"),
    ],
)
def test_malformed_tool_call_text_is_returned_as_plain_content(text, why):
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.tool_calls == []
    assert why in parsed.malformed


def test_missing_arguments_mean_no_arguments():
    parsed = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')
    assert parsed.content is None
    assert parsed.tool_calls[0]["function"] == {"name": "now", "arguments": "{}"}


def test_format_is_what_the_tiny_template_renders(tiny_tokenizer):
    message = {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [call("f", {"x": 1}), call("g", {"y": "é"})],
    }
    expected = 'Sure.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>{"name": "g", "arguments": {"y": "é"}}</tool_call>'  # noqa: E501
    assert format_tool_calls(message["content"], message["tool_calls"]) == expected
    assert assistant_turn_text(tiny_tokenizer, message) == expected


def test_parse_reads_back_what_each_template_renders(any_tokenizer):
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("get_weather", {"city": "Oslo", "days": 2})],
    }
    parsed = parse_tool_calls(assistant_turn_text(any_tokenizer, message))
    assert parsed.malformed is None and parsed.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Oslo", "days": 2})
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
contents = st.one_of(st.none(), st.text(max_size=30)).filter(
    lambda c: c is None or ("<tool_call>" not in c and "</tool_call>" not in c)
)


@settings(max_examples=200, deadline=None)
@given(
    content=contents,
    calls=st.lists(st.tuples(names, st.dictionaries(st.text(max_size=6), json_values)), max_size=3),
)
def test_format_then_parse_round_trips(content, calls):
    tool_calls = [call(n, a) for n, a in calls]
    parsed = parse_tool_calls(format_tool_calls(content, tool_calls))
    if not tool_calls:
        assert parsed.content == (content or "") and parsed.tool_calls == []
        return
    assert parsed.malformed is None
    assert parsed.content == ((content or "").rstrip() or None)
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ] == calls


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*'<>/{}":, abnmeargus[]1\n', "<tool_call>", "</tool_call>", '"name"']), max_size=40
    )
)
def test_parse_never_raises_and_never_loses_text(pieces):
    text = "".join(pieces)
    parsed = parse_tool_calls(text)
    if not parsed.tool_calls:
        assert parsed.content == text
