"""Tool-call parsers per model family: grove's own hermes parser, or one of vLLM's.

A policy writes tool calls in its model family's format: hermes `<tool_call>{json}</tool_call>` (grove's
tiny model, Qwen2.5, Hermes), Qwen3-Coder's `<tool_call><function=name><parameter=...>` XML, Llama 3's
JSON after `<|python_tag|>`, Mistral's `[TOOL_CALLS]name[ARGS]{json}`, pythonic `[f(x=1)]`, ... vLLM
maintains a parser for each (the registry behind its OpenAI server's `--tool-call-parser`,
`vllm.tool_parsers.ToolParserManager`); grove reuses it. The engine's `EngineConfig.tool_call_parser`
selects one per served model: "hermes" (the default) is grove's own strict parser
(chat/toolcalls.py); any other name is vLLM's parser of that name (`available_parsers()`).

What a parser may and may not change:
- It turns the generated text into the assistant message the harness gets (content + tool calls). It
  never changes the sampled tokens: they are staged before parsing, and a continuation splices them
  exactly (the next request's echo of the message is compared with the recorded message, not re-parsed).
- Output it cannot parse is plain content (the text as generated, no tool calls, never an exception):
  a parser that raises, finds no call, or returns a name that is no function name or arguments that
  are not a JSON object. Beyond that, what counts as malformed is the vLLM parser's judgement, as in
  vLLM's own server: e.g. Qwen3-Coder's parser completes a final call left unclosed at the end of the
  text and drops text after the last call. grove's hermes parser is stricter (any text between or
  after blocks, any unclosed block: plain content).
- Tool-call ids are grove's deterministic `{id_prefix}_{i}` (vLLM's are random), so a retried
  generation answers the same message.

How vLLM's parsers use the tokenizer: each is built with the model's tokenizer and looks up its
format's marker tokens in the vocabulary at construction (Llama 3: `<|python_tag|>`; Mistral:
`[TOOL_CALLS]`); a tokenizer without them cannot serve that format, so `tool_parser` refuses it when
the engine starts (`ToolParserUnavailableError`), not at the first call. Some parsers convert argument
types with the request's tool schemas (Qwen3-Coder's `<parameter=limit>3` becomes `3` for an integer
parameter): `parse` takes the call's tools. vLLM is imported only when a vLLM parser is asked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from chat.toolcalls import ParsedAssistant, parse_tool_calls

HERMES = "hermes"  # grove's own parser (chat/toolcalls.py), the default
# A function name as OpenAI's tools have them (plus '.' and ':', which MCP-style names use); a parser that
# returns anything else misread the output (e.g. Mistral's parser on the older JSON-list format)
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class ToolParserError(ValueError):
    """Base of tool-parser selection errors (raised when an engine starts, never for model output)."""


class UnknownToolParserError(ToolParserError):
    """No parser of that name: neither grove's "hermes" nor one registered in vLLM."""


class ToolParserUnavailableError(ToolParserError):
    """vLLM's parser of that name cannot be built with this model's tokenizer (its marker tokens are
    not in the vocabulary)."""


class ToolCallParser(Protocol):
    @property
    def name(self) -> str: ...  # read-only: a frozen parser (HermesParser) serves too

    def parse(
        self, text: str, *, id_prefix: str = "call", tools: list[dict[str, Any]] | None = None
    ) -> ParsedAssistant: ...


@dataclass(frozen=True)
class HermesParser:
    """grove's strict hermes parser: blocks separated by whitespace only, else plain content."""

    name: str = HERMES

    def parse(
        self, text: str, *, id_prefix: str = "call", tools: list[dict[str, Any]] | None = None
    ) -> ParsedAssistant:
        return parse_tool_calls(text, id_prefix=id_prefix)


def available_parsers() -> list[str]:
    """Every selectable name: "hermes" plus vLLM's registered parsers."""
    from vllm.tool_parsers import ToolParserManager

    return sorted({HERMES, *ToolParserManager.list_registered()})


def _plain(text: str, why: str | None) -> ParsedAssistant:
    return ParsedAssistant(content=text, tool_calls=[], malformed=why)


class VllmToolParser:
    """One of vLLM's tool parsers, built per parse (they keep streaming state) with the model's tokenizer."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            self._cls = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise UnknownToolParserError(
                f"tool-call parser {name!r} is neither grove's {HERMES!r} nor one of vLLM's; choose one of "
                f"{available_parsers()} (EngineConfig.tool_call_parser)"
            ) from None
        self.name = name
        self._tokenizer = tokenizer
        try:
            self._cls(tokenizer, tools=None)  # the marker tokens are looked up here
        except Exception as err:
            raise ToolParserUnavailableError(
                f"vLLM's tool-call parser {name!r} cannot serve model tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '?')!r}: {type(err).__name__}: {err}. Choose the "
                "parser of the model's family (its chat template shows the tool-call format)"
            ) from None

    def _request(self, tools: list[dict[str, Any]] | None) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        try:
            return ChatCompletionRequest(model="grove", messages=[], tools=tools or None)
        except ValueError:  # a tool schema vLLM's model refuses: parse without the schemas
            return ChatCompletionRequest(model="grove", messages=[])

    def parse(
        self, text: str, *, id_prefix: str = "call", tools: list[dict[str, Any]] | None = None
    ) -> ParsedAssistant:
        try:
            info = self._cls(self._tokenizer, tools=None).extract_tool_calls(text, self._request(tools))
        except Exception as err:  # model output is untrusted: any parser failure leaves it plain
            return _plain(text, f"{self.name} parser failed: {type(err).__name__}: {err}")
        if not info.tools_called or not info.tool_calls:
            return _plain(text, None)
        calls = []
        for i, call in enumerate(info.tool_calls):
            name, arguments = call.function.name, call.function.arguments
            try:
                parsed = json.loads(arguments)
            except (TypeError, json.JSONDecodeError):
                parsed = None
            if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
                return _plain(text, f"tool call {i}: {name!r} is not a function name")
            if not isinstance(parsed, dict):
                return _plain(text, f"tool call {i} ({name!r}): arguments are not a JSON object")
            fn = {"name": name, "arguments": arguments}
            calls.append({"id": f"{id_prefix}_{i}", "type": "function", "function": fn})
        content = info.content if info.content and info.content.strip() else None
        return ParsedAssistant(content=content, tool_calls=calls)


def tool_parser(name: str, tokenizer: Any) -> ToolCallParser:
    """The parser `name` for a model with this tokenizer (UnknownToolParserError,
    ToolParserUnavailableError)."""
    return HermesParser() if name == HERMES else VllmToolParser(name, tokenizer)
