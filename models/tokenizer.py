"""The tiny model's tokenizer: a byte-level BPE trained locally, its special tokens and its chat template.

Nothing can be downloaded here, so the tokenizer is trained with the `tokenizers` library on the
synthetic corpus of models/corpus.py. Byte-level BPE over an alphabet of all 256 bytes means every
string encodes without an unknown token. Training is deterministic: the same texts give the same
tokenizer.json bytes.

The chat template is ChatML with hermes-style tool calls, written so that a conversation renders
*prefix-stably*: the rendering of messages[:k] is a prefix of the rendering of messages[:k+1]
(each message renders on its own, independent of later messages), which the gateway's exact-prefix
splice relies on. Every turn ends with `<|im_end|>` + newline; generation stops at `<|im_end|>`.

The added tokens (control tokens and tool tags) are matched by the tokenizer anywhere in a string, so
chat prompts are not tokenized as one string: the gateway and the generate activity encode only the
template's own markers as added tokens and message content as plain text
(chat/content_tokens.py), so a user's literal `<|im_start|>` never becomes a control token.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

# Control tokens: skipped by `decode(skip_special_tokens=True)`.
CONTROL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)
# Tool tags are atomic added tokens but *not* special (as in Qwen2.5): decoded text keeps them, so a
# hermes tool-call parser sees them even when the server skips special tokens.
TOOL_TOKENS: tuple[str, ...] = (TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)
ALL_ADDED_TOKENS: tuple[str, ...] = CONTROL_TOKENS + TOOL_TOKENS

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>{"name": <function-name>, '
    '"arguments": <args-json-object>}</tool_call>'
)


# ChatML + hermes tool calls. Written with `{%- ... %}` / `{{- ... }}` everywhere so that whitespace is
# exactly what the string literals say. Each message's text depends only on that message (and on
# `tools` for the first system turn), which is what makes the rendering prefix-stable.
def chat_template(default_system: str | None = None) -> str:
    """ChatML + hermes tool calls; `default_system`: the system text used when the conversation has no
    system message (SmolLM2 was trained with one), None: no system turn then (the tiny model)."""
    default = "" if default_system is None else default_system
    return (
        "{%- macro render_content(content, role) -%}\n"
        "    {%- if content is none -%}\n"
        "    {%- elif content is string -%}{{- content -}}\n"
        "    {%- elif content is iterable and content is not mapping -%}\n"
        "        {%- for part in content -%}\n"
        "            {%- if part is mapping and part.type == 'text' -%}{{- part.text -}}\n"
        "            {%- else -%}{{- raise_exception('Only text content parts are supported; got a ' "
        "+ role + ' message with a part of type ' + (part.type | string) + '.') -}}\n"
        "            {%- endif -%}\n"
        "        {%- endfor -%}\n"
        "    {%- else -%}{{- raise_exception('Message content must be a string, a list of text parts or "
        "null; got something else in a ' + role + ' message.') -}}\n"
        "    {%- endif -%}\n"
        "{%- endmacro -%}\n"
        "{%- if tools -%}\n"
        "    {{- '<|im_start|>system\\n' -}}\n"
        "    {%- if messages and messages[0].role == 'system' -%}\n"
        "        {{- render_content(messages[0].content, 'system') + '\\n\\n' -}}\n"
        + ("" if default_system is None else "    {%- else -%}{{- " + repr(default + "\n\n") + " -}}\n")
        + "    {%- endif -%}\n"
        "    {{- " + repr(TOOLS_PREAMBLE) + " -}}\n"
        "    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}\n"
        "    {{- " + repr(TOOLS_POSTAMBLE) + " + '<|im_end|>\\n' -}}\n"
        "{%- elif messages and messages[0].role == 'system' -%}\n"
        "    {{- '<|im_start|>system\\n' + render_content(messages[0].content, 'system') "
        "+ '<|im_end|>\\n' -}}\n"
        + (
            ""
            if default_system is None
            else "{%- else -%}{{- " + repr("<|im_start|>system\n" + default + "<|im_end|>\n") + " -}}\n"
        )
        + "{%- endif -%}\n"
        "{%- for message in messages -%}\n"
        "    {%- if message.role == 'system' -%}\n"
        "        {%- if not loop.first -%}\n"
        "            {{- '<|im_start|>system\\n' + render_content(message.content, 'system') "
        "+ '<|im_end|>\\n' -}}\n"
        "        {%- endif -%}\n"
        "    {%- elif message.role == 'user' -%}\n"
        "        {{- '<|im_start|>user\\n' + render_content(message.content, 'user') + '<|im_end|>\\n' -}}\n"
        "    {%- elif message.role == 'assistant' -%}\n"
        "        {%- set body = render_content(message.content, 'assistant') -%}\n"
        "        {{- '<|im_start|>assistant\\n' + body -}}\n"
        "        {%- for tool_call in (message.tool_calls or []) -%}\n"
        "            {%- if tool_call.function is defined -%}"
        "{%- set tool_call = tool_call.function -%}{%- endif -%}\n"
        "            {%- if body or not loop.first -%}{{- '\\n' -}}{%- endif -%}\n"
        "            {{- '<tool_call>{\"name\": ' + (tool_call.name | tojson) + ', \"arguments\": ' -}}\n"
        "            {%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}\n"
        "            {%- else -%}{{- tool_call.arguments | tojson -}}\n"
        "            {%- endif -%}\n"
        "            {{- '}</tool_call>' -}}\n"
        "        {%- endfor -%}\n"
        "        {{- '<|im_end|>\\n' -}}\n"
        "    {%- elif message.role == 'tool' -%}\n"
        "        {{- '<|im_start|>tool\\n<tool_response>' + render_content(message.content, 'tool') "
        "+ '</tool_response><|im_end|>\\n' -}}\n"
        "    {%- else -%}\n"
        "        {{- raise_exception('Unknown message role ' + (message.role | string) "
        "+ '; expected system, user, assistant or tool.') -}}\n"
        "    {%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
    )


CHAT_TEMPLATE = chat_template()


class TokenizerTrainingError(Exception):
    """BPE training produced a vocabulary of the wrong size (the corpus is too small for the target)."""


def _added_tokens() -> list[AddedToken]:
    control = [AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS]
    tools = [AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS]
    return control + tools


def train_tokenizer(texts: Iterable[str], *, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE whose full vocabulary (added tokens included) has exactly `vocab_size` ids.

    Ids 0-2 are the control tokens, the tool tags take the last four ids, the rest are the 256 byte
    symbols plus learned merges. Digits are split one by one so arithmetic text is tokenized uniformly.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise TokenizerTrainingError(
            f"BPE training gave {tok.get_vocab_size(with_added_tokens=True)} tokens, expected exactly "
            f"{vocab_size}: the corpus has too few distinct merges; "
            "raise the corpus size or lower vocab_size."
        )
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, *, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json (special tokens included) and chat_template.jinja.

    eos/pad is `<|endoftext|>` (document separator); chat generation stops at `<|im_end|>` through
    generation_config.json's eos_token_id list, written by the model builder.
    """
    from transformers import PreTrainedTokenizerFast  # heavy import, only when saving

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START, IM_END],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
