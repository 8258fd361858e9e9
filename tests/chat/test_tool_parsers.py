"""Tool calls of other model families through vLLM's parsers (chat/tool_parsers.py): the text a
policy of each family writes, as token ids of a real tokenizer decoded the way the engine decodes them,
becomes the OpenAI message; malformed output stays plain content; a continuation splices the exact
sampled tokens whichever parser made the message.

Each case runs on the tiny model's and SmolLM2's tokenizers. Llama 3 and Mistral mark tool calls with
special tokens of their own vocabularies; the tokenizers get them added (as those models have them)."""

from __future__ import annotations

import copy
import json

import pytest

from chat.render import Predecessor, UndeclaredDiscontinuityError, render_chat, render_root
from chat.tool_parsers import (
    HERMES,
    ToolParserUnavailableError,
    UnknownToolParserError,
    available_parsers,
    tool_parser,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            },
        },
    }
]
MARKERS = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]"]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from models.smollm2 import find_smollm2_source

    src = find_smollm2_source()
    return AutoTokenizer.from_pretrained(str(src.gguf_path.parent), gguf_file=src.gguf_path.name)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def marked_tokenizer(request, tiny_tokenizer, smollm2_tokenizer):
    """grove's real tokenizers (the tiny model's, SmolLM2's) with Llama 3's and Mistral's tool-call marker
    tokens added."""
    tok = copy.deepcopy(tiny_tokenizer if request.param == "tiny" else smollm2_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    return tok


def generated(tokenizer, text: str) -> str:
    """`text` as the engine hands it to the parser: sampled ids decoded with special tokens kept."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    for marker in MARKERS:  # sampled as one special token each, as the real models do
        assert marker not in text or tokenizer.convert_tokens_to_ids(marker) in ids
    return tokenizer.decode(ids, skip_special_tokens=False)


FORMATS = [
    (
        HERMES,
        'Sure.\n<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>',
        "Sure.",
        {"path": "a.txt"},
    ),
    (  # Qwen3-Coder's XML; the parser types `limit` by the tool schema (integer)
        "qwen3_coder",
        "Let me read.\n<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n"
        "<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>",
        "Let me read.",
        {"path": "a.txt", "limit": 3},
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "read_file", "parameters": {"path": "a.txt", "limit": 3}}',
        None,
        {"path": "a.txt", "limit": 3},
    ),
    ("mistral", '[TOOL_CALLS]read_file[ARGS]{"path": "a.txt"}', None, {"path": "a.txt"}),
    ("pythonic", '[read_file(path="a.txt", limit=3)]', None, {"path": "a.txt", "limit": 3}),
]


@pytest.mark.parametrize(("name", "text", "content", "arguments"), FORMATS, ids=[f[0] for f in FORMATS])
def test_each_family_s_tool_call_becomes_an_openai_tool_call(
    marked_tokenizer, name, text, content, arguments
):
    parsed = tool_parser(name, marked_tokenizer).parse(
        generated(marked_tokenizer, text), id_prefix="call_t", tools=TOOLS
    )
    assert parsed.malformed is None and parsed.content == content
    [call] = parsed.tool_calls
    assert (call["id"], call["type"], call["function"]["name"]) == ("call_t_0", "function", "read_file")
    assert json.loads(call["function"]["arguments"]) == arguments


MALFORMED = [
    (HERMES, '<tool_call>{"name": "read_file", "arguments": {"path": '),
    ("llama3_json", '<|python_tag|>{"name": "read_file", "parameters": [1'),
    ("llama3_json", 'The answer is {"a": 1}.'),  # JSON, but no call
    ("mistral", 'ok [TOOL_CALLS]read_file[ARGS]{"path": '),
    ("mistral", '[TOOL_CALLS][{"name": "read_file", "arguments": {}}]'),  # misread: "[" is no name
    ("pythonic", "[read_file(path="),
    ("qwen3_coder", "No tool needed: the answer is 4."),
]


@pytest.mark.parametrize(("name", "text"), MALFORMED)
def test_malformed_output_stays_plain_content(marked_tokenizer, name, text):
    text = generated(marked_tokenizer, text)
    parsed = tool_parser(name, marked_tokenizer).parse(text, id_prefix="call_t", tools=TOOLS)
    assert (parsed.content, parsed.tool_calls) == (text, [])
    assert parsed.message() == {"role": "assistant", "content": text}


def test_parsers_are_chosen_by_name_and_checked_against_the_tokenizer(tiny_tokenizer):
    assert {HERMES, "qwen3_coder", "llama3_json", "mistral", "pythonic"} <= set(available_parsers())
    with pytest.raises(UnknownToolParserError, match="qwen3_coder"):
        tool_parser("no-such-format", tiny_tokenizer)
    # the tiny vocabulary has no <|python_tag|>: Llama 3's format cannot be served by it
    with pytest.raises(ToolParserUnavailableError, match="python_tag"):
        tool_parser("llama3_json", tiny_tokenizer)


def test_a_continuation_splices_the_sampled_tokens_whatever_parser_made_the_message(tiny_tokenizer):
    """The tiny template renders hermes, but the policy wrote Qwen3-Coder XML: the next request echoes the
    message the qwen3_coder parser made, and the prompt is the parent's prompt + its exact sampled ids
    + the new suffix. The hermes parser would not have read that message from those tokens."""
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Read a.txt"}]
    prompt = render_root(tiny_tokenizer, messages, TOOLS)
    text = (
        "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>\n</tool_call>"
    )
    completion = [*tiny_tokenizer.encode(text, add_special_tokens=False), tiny_tokenizer.eos_token_id]
    qwen = tool_parser("qwen3_coder", tiny_tokenizer)
    message = qwen.parse(text, id_prefix="call_p").message()
    nxt = [*messages, message, {"role": "tool", "tool_call_id": "call_p_0", "content": "hello"}]
    parent = Predecessor(messages=messages, prompt_ids=prompt, completion_ids=completion, tools=TOOLS)
    rendered = render_chat(tiny_tokenizer, nxt, TOOLS, parent, tool_parser=qwen)
    assert rendered.continuation
    assert rendered.prompt_ids[: len(prompt) + len(completion)] == [*prompt, *completion]
    with pytest.raises(UndeclaredDiscontinuityError):
        render_chat(tiny_tokenizer, nxt, TOOLS, parent)  # hermes reads plain content from those tokens


async def test_an_engine_refuses_a_parser_its_model_cannot_serve_before_starting(tiny_model_dir):
    from activities.engine import PolicyEngine
    from activities.engine_config import EngineConfig

    assert EngineConfig(model_dir=tiny_model_dir).tool_call_parser == HERMES  # the default
    with pytest.raises(ToolParserUnavailableError, match="llama3_json"):
        await PolicyEngine.start(EngineConfig(model_dir=tiny_model_dir, tool_call_parser="llama3_json"))
    with pytest.raises(UnknownToolParserError):
        await PolicyEngine.start(EngineConfig(model_dir=tiny_model_dir, tool_call_parser="hermes2"))
