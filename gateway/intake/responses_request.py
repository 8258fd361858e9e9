"""The OpenAI Responses API request the gateway accepts (`POST .../v1/responses`, Codex CLI's only wire
format), validated into typed input items and tools.

What is taken, and how (gateway/intake/responses_chat.py turns it into the chat form the policy's template
renders):

- `input`: a string (one user message) or a list of items: `message` (roles developer, system, user,
  assistant; `input_text` / `output_text` parts or a string), `function_call` (with its `namespace` when
  the tool sits in one) / `function_call_output`, `custom_tool_call` / `custom_tool_call_output`. Items
  the gateway never produces and the policy cannot read are refused by type, naming the item:
  `reasoning` (the served policy emits none, so a reasoning item is not its own), built-in tool calls
  (`web_search_call`, `tool_search_call`, `local_shell_call`, ...), `item_reference`, `compaction`.
- `tools`: `function`, `namespace` (a group of functions, e.g. Codex's `multi_agent_v1`),
  `custom` (free-form input, optionally with a grammar: Codex's `apply_patch`). Built-in tools
  (`web_search`, `tool_search`, `file_search`, ...) run on OpenAI's side, which this gateway is not:
  refused with the name of the setting that turns them off.
- Sampling: `temperature`, `top_p`, `max_output_tokens` become the call's SamplingConfig (as the chat
  path: gateway/intake/chat_request.py). What would change the sampled distribution in a way the learner
  does not mirror (constrained text formats, forced tools, logprobs, background runs) is refused unless
  at its no-op value; `conversation` (OpenAI's server-side conversation objects) is refused.
- `previous_response_id`: the id of a response this episode's gateway returned; the request continues that
  call's history (its prompt messages and its response, from the gateway's record) with `input`
  (gateway/intake/previous_response.py). An id the gateway never made is refused here; whether it names
  a recorded call of the episode is checked before capture (gateway/pipeline/previous_response.py).
- Accepted without effect: a function's `strict` (grove samples without constrained decoding, as on the
  chat path: the arguments are what the policy wrote, and the learner scores exactly that), `store` (the
  gateway records every call until its episode closes either way: that record is the training data),
  `include` (only `reasoning.encrypted_content`: no reasoning is ever produced), `reasoning` (the
  served policy has no effort setting), `text.verbosity`,
  `parallel_tool_calls` (the policy may write several calls either way), `prompt_cache_key`,
  `client_metadata`, `metadata`, `user`, `safety_identifier`, `service_tier`, `truncation: "disabled"`.

Unknown parameters and unknown fields inside items are refused (fail closed). Every refusal is a
`RequestError` (HTTP 400 unless said otherwise) naming the parameter or item, rendered in the
OpenAI error shape (`{"error": {"message", "type", "param", "code"}}`) the Responses API uses too
(gateway/http/wire/responses.py).

Pure module.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gateway.intake.capture_request import RequestError
from gateway.intake.chat_request import (
    UnknownModelError,
    UnsupportedContentError,
    UnsupportedParameterError,
)
from gateway.intake.previous_response import parse_response_id


class ResponsesRequestError(RequestError):
    """Base of bad Responses requests (HTTP 400)."""


class InvalidResponsesRequestError(ResponsesRequestError):
    """A body that is not a valid Responses request (missing or malformed fields)."""


class UnsupportedInputItemError(ResponsesRequestError):
    """An input item of a type the gateway does not take (reasoning, built-in tool calls, references)."""


class UnsupportedToolError(ResponsesRequestError):
    """A tool the gateway cannot offer the policy (built-in tools run on OpenAI's side)."""


class ConversationNotServedError(ResponsesRequestError):
    """`conversation`: OpenAI's server-side conversation objects, which the gateway does not keep."""


# ------------------------------------------------------------------------------------------- items


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageItem(_Strict):
    """A message; its id and status are the client's bookkeeping (never rendered)."""

    type: Literal["message"] = "message"
    role: Literal["developer", "system", "user", "assistant"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class CustomToolCallItem(_Strict):
    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputItem(_Strict):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | CustomToolCallItem | FunctionCallOutputItem | CustomToolCallOutputItem,
    Field(discriminator="type"),
]
_ITEM = TypeAdapter(InputItem)
ITEM_TYPES = frozenset(
    {"message", "function_call", "custom_tool_call", "function_call_output", "custom_tool_call_output"}
)
CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
# why each item type the gateway knows of is refused
_REFUSED_ITEMS = {
    "reasoning": "the served policy writes no reasoning items, so this one is not its own; drop reasoning "
    "items from the input (and `reasoning.encrypted_content` needs no `include`)",
    "item_reference": "the gateway keeps no items to refer to; send the item itself",
    "compaction": "remote compaction summaries are OpenAI's; this gateway compacts nothing itself (let the "
    "client summarise with an ordinary request)",
}


# ------------------------------------------------------------------------------------------- tools


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(_Strict):
    """A named group of function tools; the policy sees its functions by their own names."""

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[FunctionTool]


class CustomFormat(_Strict):
    type: Literal["text", "grammar"]
    syntax: str | None = None
    definition: str | None = None


class CustomTool(_Strict):
    """A tool whose input is free-form text (optionally in a grammar), not JSON arguments."""

    type: Literal["custom"]
    name: str = Field(min_length=1)
    description: str | None = None
    format: CustomFormat | None = None


Tool = Annotated[FunctionTool | NamespaceTool | CustomTool, Field(discriminator="type")]
_TOOL = TypeAdapter(Tool)
_REFUSED_TOOLS = {
    "web_search": "web search runs on OpenAI's side; turn it off in the client (Codex: web_search = "
    '"disabled" in config.toml)',
    "web_search_preview": "web search runs on OpenAI's side; turn it off in the client",
    "tool_search": "tool search runs deferred tools through OpenAI's side; give the tools themselves (Codex: "
    "a model catalog entry with supports_search_tool false)",
    "file_search": "file search runs on OpenAI's vector stores; give a function tool instead",
    "code_interpreter": "the code interpreter runs on OpenAI's side; give a function tool instead",
    "computer_use_preview": "computer use runs on OpenAI's side",
    "image_generation": "the served model generates text only",
    "local_shell": "the local shell tool needs a model trained on OpenAI's shell format; give a function",
    "mcp": "remote MCP servers are called from OpenAI's side; give the client the MCP server instead",
}


# ------------------------------------------------------------------------------------------- request

_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "stream",
        "temperature",
        "top_p",
        "max_output_tokens",
        "previous_response_id",
    }
)
IGNORED = frozenset(
    {
        "store",
        "parallel_tool_calls",
        "prompt_cache_key",
        "client_metadata",
        "metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "reasoning",
    }
)
_NO_EFFECT: dict[str, tuple[Any, str]] = {
    "include": (
        lambda v: not v or set(v) <= {"reasoning.encrypted_content"},
        "only reasoning.encrypted_content may be included (and there is none): the gateway returns no "
        "logprobs, search results or images",
    ),
    "tool_choice": (
        lambda v: v in (None, "auto"),
        "only tool_choice 'auto': forcing or forbidding tools needs constrained decoding",
    ),
    "text": (
        lambda v: (
            v is None
            or (isinstance(v, dict) and set(v) <= {"verbosity", "format"} and _plain_format(v.get("format")))
        ),
        "constrained text formats (json_schema, json_object) change the distribution the learner recomputes",
    ),
    "truncation": (lambda v: v in (None, "disabled"), "the gateway never drops input items ('auto')"),
    "top_logprobs": (lambda v: not v, "the gateway does not return logprobs (grove records them itself)"),
    "background": (lambda v: not v, "background responses need server-side state; send the request itself"),
    "max_tool_calls": (lambda v: v is None, "limiting tool calls needs constrained decoding"),
    "prompt": (lambda v: v is None, "stored prompts live on OpenAI's side; send the instructions"),
}


def _plain_format(fmt: Any) -> bool:
    return fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text")


class ResponsesRequest(BaseModel):
    """The accepted parameters; `items` and `tools` are the validated input and tool list."""

    model_config = ConfigDict(extra="ignore")

    model: str
    instructions: str | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    previous_response_id: str | None = None
    items: list[InputItem] = Field(default_factory=list)
    tool_list: list[Tool] = Field(default_factory=list)


def _fail(message: str, param: str, cls: type[ResponsesRequestError] = InvalidResponsesRequestError):
    raise cls(message, param=param)


def _check_parameters(body: dict[str, Any]) -> None:
    if body.get("conversation") is not None:
        _fail(
            "parameter conversation is not supported: the gateway keeps no conversation objects; send the "
            "whole conversation as `input`, or continue a response with `previous_response_id`",
            "conversation",
            ConversationNotServedError,
        )
    for name, value in body.items():
        if name in _FIELDS or name in IGNORED or name == "conversation":
            continue
        if name not in _NO_EFFECT:
            raise UnsupportedParameterError(
                f"parameter {name!r} is not supported by the grove gateway's Responses API; accepted: "
                f"{sorted(_FIELDS | IGNORED)} (and {sorted(_NO_EFFECT)} only at their no-op values)",
                param=name,
            )
        harmless, why = _NO_EFFECT[name]
        if not harmless(value):
            raise UnsupportedParameterError(f"parameter {name}={value!r} is not supported: {why}", param=name)


def _validation_message(err: ValidationError) -> tuple[str, str]:
    first = err.errors()[0]
    return ".".join(str(p) for p in first["loc"]), first["msg"]


def parse_item(raw: Any, index: int) -> InputItem:
    """One input item, or the error naming it (`input[i]`)."""
    where = f"input[{index}]"
    if not isinstance(raw, dict):
        _fail(f"{where} is a {type(raw).__name__}; expected an item object", where)
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind in _REFUSED_ITEMS:
        _fail(
            f"{where} is a {kind!r} item: {_REFUSED_ITEMS[kind]}", f"{where}.type", UnsupportedInputItemError
        )
    if kind not in ITEM_TYPES:
        _fail(
            f"{where} has type {kind!r}, which the grove gateway does not take; accepted item types: "
            f"{sorted(ITEM_TYPES)} (built-in tool calls run on OpenAI's side: turn those tools off)",
            f"{where}.type",
            UnsupportedInputItemError,
        )
    try:
        return _ITEM.validate_python({**raw, "type": kind})
    except ValidationError as err:
        loc, msg = _validation_message(err)
        loc = loc.split(".", 1)[1] if "." in loc else loc  # drop the union tag pydantic puts first
        _fail(f"{where} ({kind}): {loc}: {msg}", f"{where}.{loc}")
    raise AssertionError("unreachable")


def parse_tool(raw: Any, index: int) -> Tool:
    """One tool, or the error naming it (`tools[i]`)."""
    where = f"tools[{index}]"
    if not isinstance(raw, dict):
        _fail(f"{where} is a {type(raw).__name__}; expected a tool object", where)
    kind = raw.get("type")
    if kind in _REFUSED_TOOLS:
        _fail(
            f"{where} is the built-in tool {kind!r}: {_REFUSED_TOOLS[kind]}",
            f"{where}.type",
            UnsupportedToolError,
        )
    if kind not in ("function", "namespace", "custom"):
        _fail(
            f"{where} has type {kind!r}; the grove gateway takes tools of type function, namespace, custom",
            f"{where}.type",
            UnsupportedToolError,
        )
    try:
        tool = _TOOL.validate_python(raw)
    except ValidationError as err:
        loc, msg = _validation_message(err)
        loc = loc.split(".", 1)[1] if "." in loc else loc
        _fail(f"{where} ({kind}): {loc}: {msg}", f"{where}.{loc}")
    return tool


def _items_of(value: Any) -> list[InputItem]:
    if isinstance(value, str):
        return [MessageItem(role="user", content=value)]
    if not isinstance(value, list) or not value:
        _fail("input must be a string or a non-empty list of items", "input")
    return [parse_item(raw, i) for i, raw in enumerate(value)]


def parse_responses_request(body: Any, served_model: str) -> ResponsesRequest:
    """Validate a decoded JSON body; raises a RequestError subclass naming the bad field or item."""
    if not isinstance(body, dict):
        _fail("the request body must be a JSON object", "body")
    if "input" not in body:
        _fail("the request has no `input`: send the conversation as a list of items", "input")
    _check_parameters(body)
    scalars = {k: v for k, v in body.items() if k in _FIELDS and k not in ("input", "tools")}
    for name in ("temperature", "top_p", "max_output_tokens", "stream"):
        if isinstance(scalars.get(name), bool) and name != "stream":
            _fail(f"{name}={scalars[name]!r} is a boolean; give a number", name)
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        _fail("tools must be a list", "tools")
    try:
        request = ResponsesRequest.model_validate(scalars)
    except ValidationError as err:
        loc, msg = _validation_message(err)
        _fail(f"invalid request: {loc}: {msg}", loc)
    items = _items_of(body["input"])
    request = request.model_copy(
        update={"items": items, "tool_list": [parse_tool(raw, i) for i, raw in enumerate(tools)]}
    )
    if request.model != served_model:
        raise UnknownModelError(
            f"model {request.model!r} is not served here; this gateway serves {served_model!r}", param="model"
        )
    if request.previous_response_id is not None:
        parse_response_id(request.previous_response_id)  # an id the gateway never made: refused here
    return request


# the keys a text part may have, by its type (the rest is refused: it would be dropped unseen)
TEXT_PART_KEYS = {
    "input_text": frozenset({"type", "text"}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
}


def text_parts(content: str | list[dict[str, Any]], where: str, kind: str) -> str:
    """The text of a message's content or a tool's output: a string, or its `kind` parts
    (`input_text` or `output_text`) joined. Anything else (images, files, audio, refusals, annotations)
    is refused: the served model reads text, and what it did not read must not be recorded as read."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if part.get("type") != kind or not isinstance(part.get("text"), str):
            raise UnsupportedContentError(
                f"{at} is a part of type {part.get('type')!r}; the grove gateway serves a text-only model "
                f"and takes only {kind!r} parts with a string 'text' here. Send the text, or describe the "
                "image/file in words",
                param=f"{at}.type",
            )
        extra = set(part) - TEXT_PART_KEYS[kind]
        if extra or part.get("annotations") or part.get("logprobs"):
            raise UnsupportedContentError(
                f"{at} ({kind}) carries {sorted(extra) or 'annotations/logprobs'}, which the gateway would "
                "not render; send the text alone",
                param=at,
            )
        texts.append(part["text"])
    return "".join(texts)
