"""Chat rendering with exact prefix splice (pure; real tokenizer and chat templates, no engine)."""

from __future__ import annotations

import copy
import json

import pytest

from chat.render import (
    NoChatTemplateError,
    Predecessor,
    TemplateNotPrefixStableError,
    UndeclaredDiscontinuityError,
    render_chat,
    render_root,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
HISTORY = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Oslo?"}]
# What the model generated (hermes tool call, then end of turn), as text.
GENERATED = (
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call><|im_end|>'
)
# How OpenCode sends that response back: content null, arguments re-serialised as compact JSON.
ECHOED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo","days":2}'},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 3 C"}


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def text(tok, token_ids) -> str:
    return tok.decode(list(token_ids), skip_special_tokens=False)


def predecessor(tok, messages=HISTORY, generated=GENERATED, tools=TOOLS) -> Predecessor:
    prompt = render_root(tok, messages, tools)
    return Predecessor(messages=messages, prompt_ids=prompt, completion_ids=ids(tok, generated), tools=tools)


def test_root_is_the_templates_rendering(tiny_tokenizer):
    out = render_chat(tiny_tokenizer, HISTORY, TOOLS)
    expected = tiny_tokenizer.apply_chat_template(
        HISTORY, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert not out.continuation and out.suffix_ids is None
    assert out.prompt_ids == ids(tiny_tokenizer, expected)
    assert text(tiny_tokenizer, out.prompt_ids).endswith(
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("template", "expected_suffix"),
    [
        (
            "tiny",
            "\n<|im_start|>tool\n<tool_response>sunny, 3 C</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            "qwen25",
            "\n<|im_start|>user\n<tool_response>\nsunny, 3 C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
    ],
)
def test_continuation_with_compact_json_arguments_splices_exact_tokens(
    template, expected_suffix, tiny_tokenizer, qwen25_tokenizer
):
    tok = tiny_tokenizer if template == "tiny" else qwen25_tokenizer
    pred = predecessor(tok)
    out = render_chat(tok, [*HISTORY, ECHOED, TOOL_RESULT], TOOLS, pred)
    assert out.continuation and not out.rewrite
    assert out.prompt_ids == [*pred.prompt_ids, *pred.completion_ids, *out.suffix_ids]
    assert text(tok, out.suffix_ids) == expected_suffix


def test_key_order_and_whitespace_of_arguments_do_not_matter(tiny_tokenizer):
    echoed = copy.deepcopy(ECHOED)
    echoed["tool_calls"][0]["function"]["arguments"] = '{ "days" : 2,\n "city": "Oslo" }'
    out = render_chat(tiny_tokenizer, [*HISTORY, echoed, TOOL_RESULT], TOOLS, predecessor(tiny_tokenizer))
    assert out.continuation


SYSTEM_NOTE = {"role": "system", "content": "Reminder: answer briefly."}


@pytest.mark.parametrize("added", [[], [SYSTEM_NOTE]], ids=["user", "system-then-user"])
def test_splice_equals_a_fresh_render_when_the_tokens_agree(any_tokenizer, added):
    """A plain-text answer whose sampled tokens are what the tokenizer would produce: splicing must give
    exactly the fresh render of the whole conversation (an independent check of the suffix). Claude Code
    appends system entries between turns: the splice places them as the fresh render does."""
    tok = any_tokenizer
    history = [{"role": "user", "content": "Say hi"}]
    pred = predecessor(tok, history, "Hi there, friend!<|im_end|>", tools=None)
    messages = [
        *history,
        {"role": "assistant", "content": "Hi there, friend!"},
        *added,
        {"role": "user", "content": "Again"},
    ]
    out = render_chat(tok, messages, None, pred)
    assert out.continuation
    assert out.prompt_ids == render_root(tok, messages)
    assert all(m["content"] in text(tok, out.suffix_ids) for m in added)


def test_truncated_completion_gets_the_whole_turn_closing(tiny_tokenizer):
    history = [{"role": "user", "content": "Count"}]
    pred = predecessor(tiny_tokenizer, history, "one two thr", tools=None)  # cut by max_tokens: no <|im_end|>
    messages = [
        *history,
        {"role": "assistant", "content": "one two thr"},
        {"role": "user", "content": "go on"},
    ]
    out = render_chat(tiny_tokenizer, messages, None, pred)
    assert (
        text(tiny_tokenizer, out.suffix_ids)
        == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )


def test_content_parts_and_null_equal_their_plain_forms(tiny_tokenizer):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "now?"}]}
    ]
    pred = predecessor(tiny_tokenizer, history, "Sunny.<|im_end|>", tools=None)
    messages = [
        {"role": "user", "content": "Weather now?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}], "refusal": None},
        {"role": "user", "content": "ok"},
    ]
    assert render_chat(tiny_tokenizer, messages, None, pred).continuation


def test_edited_earlier_message_is_an_undeclared_discontinuity(any_tokenizer):
    edited = [HISTORY[0], {"role": "user", "content": "Weather in Bergen?"}, ECHOED, TOOL_RESULT]
    with pytest.raises(UndeclaredDiscontinuityError, match="message 1 differs in 'content'") as err:
        render_chat(any_tokenizer, edited, TOOLS, predecessor(any_tokenizer))
    assert (err.value.index, err.value.field) == (1, "content")
    assert "Weather in Bergen?" in str(err.value) and "declare a rewrite" in str(err.value)


def test_changed_tool_call_arguments_point_at_the_response(tiny_tokenizer):
    echoed = copy.deepcopy(ECHOED)
    echoed["tool_calls"][0]["function"]["arguments"] = '{"city":"Oslo","days":3}'
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        render_chat(tiny_tokenizer, [*HISTORY, echoed, TOOL_RESULT], TOOLS, predecessor(tiny_tokenizer))
    assert (err.value.index, err.value.field) == (2, "tool_calls")


def test_only_user_tool_and_system_messages_may_be_added(tiny_tokenizer):
    extra = {"role": "assistant", "content": "and more"}
    with pytest.raises(UndeclaredDiscontinuityError, match="a new 'assistant' message") as err:
        render_chat(
            tiny_tokenizer, [*HISTORY, ECHOED, TOOL_RESULT, extra], TOOLS, predecessor(tiny_tokenizer)
        )
    assert (err.value.index, err.value.field) == (4, "role")


def test_a_shorter_history_is_a_discontinuity(tiny_tokenizer):
    with pytest.raises(
        UndeclaredDiscontinuityError, match="the request has 2 messages, expected at least 3"
    ) as err:
        render_chat(tiny_tokenizer, HISTORY, TOOLS, predecessor(tiny_tokenizer))
    assert err.value.index == 2


def test_changed_tools_are_a_discontinuity(tiny_tokenizer):
    with pytest.raises(UndeclaredDiscontinuityError, match="the tools differs") as err:
        render_chat(tiny_tokenizer, [*HISTORY, ECHOED, TOOL_RESULT], [], predecessor(tiny_tokenizer))
    assert (err.value.index, err.value.field) == (None, "tools")


def test_tool_call_ids_are_compared_only_when_both_sides_have_one(tiny_tokenizer):
    pred = predecessor(tiny_tokenizer)
    given = Predecessor(**{**pred.__dict__, "response": copy.deepcopy(ECHOED)})
    other_id = copy.deepcopy(ECHOED)
    other_id["tool_calls"][0]["id"] = "call_2"
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        render_chat(tiny_tokenizer, [*HISTORY, other_id, TOOL_RESULT], TOOLS, given)
    assert err.value.field == "tool_calls[0].id"
    # The derived response (ids unknown) accepts any id.
    assert render_chat(tiny_tokenizer, [*HISTORY, other_id, TOOL_RESULT], TOOLS, pred).continuation


def test_declared_rewrite_is_a_fresh_root(any_tokenizer):
    """OpenCode's compaction rewrites the history to [system, user, assistant summary, user]."""
    compacted = [
        HISTORY[0],
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": "We looked up the weather in Oslo."},
        {"role": "user", "content": "Continue if you have next steps"},
    ]
    pred = predecessor(any_tokenizer)
    with pytest.raises(UndeclaredDiscontinuityError):
        render_chat(any_tokenizer, compacted, TOOLS, pred)
    out = render_chat(any_tokenizer, compacted, TOOLS, pred, declared_rewrite=True)
    assert not out.continuation and out.rewrite and out.suffix_ids is None
    assert out.prompt_ids == render_root(any_tokenizer, compacted, TOOLS)


def test_a_template_that_is_not_prefix_stable_is_refused(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # Renders the number of messages up front: every new message changes the start of the prompt.
    tok.chat_template = (
        "{{- 'turns: ' + (messages | length | string) + '\\n' }}"
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    history = [{"role": "user", "content": "hi"}]
    pred = predecessor(tok, history, "hello<|im_end|>", tools=None)
    messages = [*history, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    with pytest.raises(TemplateNotPrefixStableError, match="not prefix-stable at message 1"):
        render_chat(tok, messages, None, pred)


def test_no_chat_template_is_a_named_error(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    with pytest.raises(NoChatTemplateError, match="has no chat template"):
        render_chat(tok, HISTORY)


def test_arguments_render_as_objects_for_tojson_templates(qwen25_tokenizer):
    """Qwen2.5-style templates apply `tojson` to the arguments: a JSON string would be double-encoded."""
    rendered = text(qwen25_tokenizer, render_root(qwen25_tokenizer, [*HISTORY, ECHOED, TOOL_RESULT], TOOLS))
    assert '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}' in rendered
    assert json.dumps('{"city":"Oslo","days":2}') not in rendered
