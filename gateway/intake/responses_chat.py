"""A Responses request's items and tools as the chat messages and function tools the policy's chat template
renders, and the way back: which Responses item carries each tool call the policy writes.

Items -> messages (one rule each, so that a history Codex echoes maps to exactly the messages the
gateway's earlier calls saw and answered, and the chat path's extension check splices it):

- `instructions` -> a first `system` message; a `developer` or `system` message -> `system`;
  `user` -> `user`; text parts joined (gateway/intake/responses_request.py `text_parts`).
- An `assistant` message opens an assistant turn; the `function_call` / `custom_tool_call` items right
  after it are that turn's `tool_calls` (a call with no assistant message before it opens a turn with no
  content). This is how the gateway writes one generated turn (gateway/http/responses_response.py): its
  text as a message item, then one item per call.
- `function_call` -> a tool call `{id: call_id, function: {name, arguments}}`; its `namespace` is not
  rendered (the policy calls namespaced functions by their own names). `custom_tool_call` -> a tool call
  whose arguments are `{"input": <the free-form input>}`.
- `function_call_output` / `custom_tool_call_output` -> a `tool` message with the call's id, after its
  call, of the call's own kind.
- `previous_response_id` (gateway/intake/previous_response.py): the named call's prompt messages and its
  response come first, as recorded, and the items follow them as if the client had sent that history
  whole: an output may answer a call of the previous response, a call item right after it joins its
  assistant turn. The earlier instructions are part of that history: `instructions` is then either absent
  or the same text (new instructions would edit the history the previous call was sampled on: send the
  whole history instead).

Tools -> function tools: a `function` as it is (without `strict`: nothing is constrained); each function
of a `namespace` flattened to its own name; a `custom` tool as a function of one string argument `input`,
described with its grammar. Two tools with one name are refused (the policy could not tell them apart).

Way back (`ToolRoute`): a call to a namespaced function is written as a `function_call` with that
`namespace` (Codex refuses a spawn_agent call without `"namespace": "multi_agent_v1"`); a call to a
custom tool whose arguments are exactly `{"input": <text>}` as a `custom_tool_call`; anything else as a
plain `function_call` carrying the policy's arguments unchanged (so a malformed call still comes back in
the next request as the policy wrote it, and the client answers it as its own error).

Pure module.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from chat.render import UndeclaredDiscontinuityError
from gateway.intake.capture_request import CaptureRequest, SamplingOverrides, WireFormat
from gateway.intake.previous_response import PARAM as PREVIOUS
from gateway.intake.previous_response import PreviousResponse
from gateway.intake.responses_request import (
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    NamespaceTool,
    ResponsesRequest,
    ResponsesRequestError,
    Tool,
    text_parts,
)

CUSTOM_INPUT = "input"  # the one argument a custom tool takes in its function form


class ToolNameCollisionError(ResponsesRequestError):
    """Two tools (plain, namespaced or custom) with one name: the policy calls tools by name only."""


class UnmatchedToolOutputError(ResponsesRequestError):
    """A tool output whose call_id names no earlier call in the input."""


class MismatchedToolOutputError(ResponsesRequestError):
    """A tool output of the other kind than its call (function_call_output for a custom_tool_call...)."""


class DuplicateCallIdError(ResponsesRequestError):
    """Two calls with one call_id, or two outputs for one call."""


class ChangedInstructionsError(ResponsesRequestError):
    """`instructions` other than the ones the history of `previous_response_id` starts with."""


class UnresolvedPreviousResponseError(RuntimeError):
    """A request naming a previous response captured before that response's history was read (a bug of
    the route: gateway/pipeline/previous_response.py resolves it first)."""


class InputDiscontinuityError(UndeclaredDiscontinuityError):
    """The pipeline's UndeclaredDiscontinuityError (or its more specific hint, gateway/pipeline/hints.py:
    same code, same message) naming the input item where the history differs (`param`: `input[i]`,
    `instructions` or `tools`) instead of the chat message it became."""

    def __init__(self, message: str, *, index: int | None, field: str, param: str, code: str) -> None:
        super().__init__(message, index=index, field=field)
        self.param = param
        self.openai_code = code  # the error's code as the pipeline named it


@dataclass(frozen=True)
class ToolRoute:
    """How a call to one tool is written back: a function (in a namespace or not) or a custom tool."""

    kind: Literal["function", "custom"]
    namespace: str | None = None


@dataclass(frozen=True)
class ChatForm:
    """The request as the policy sees it: chat messages and function tools, and each tool's route back."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    routes: dict[str, ToolRoute] = field(default_factory=dict)
    # where each message comes from: the input item it starts at (`input[i]`), `instructions`, or
    # `previous_response_id`; to name the request's own parameter in errors about messages
    sources: list[str] = field(default_factory=list)

    def input_param(self, index: int | None) -> str:
        """The Responses name of `messages[index]` (in a chat-path error's param): `input[i]`,
        `instructions`, `previous_response_id`, or `tools` for index None."""
        if index is None:
            return "tools"
        return self.sources[index] if 0 <= index < len(self.sources) else "input"

    def in_input_terms(self, err: UndeclaredDiscontinuityError) -> InputDiscontinuityError:
        """`err` (about messages[i]) naming the input item message i came from."""
        where = self.input_param(err.index)
        code = getattr(err, "openai_code", None) or type(err).__name__
        return InputDiscontinuityError(
            f"{where}: {err}", index=err.index, field=err.field, param=where, code=code
        )


# ------------------------------------------------------------------------------------------- tools


def _function(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if description is not None:
        fn["description"] = description
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def _custom_function(tool: CustomTool) -> dict[str, Any]:
    """A custom tool as a function of one string: its input, described with the grammar it must match."""
    fmt = tool.format
    about = "The tool's input as free-form text (not JSON)."
    if fmt is not None and fmt.type == "grammar" and fmt.definition:
        about += f" It must match this {fmt.syntax or 'grammar'} grammar:\n{fmt.definition}"
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
        "required": [CUSTOM_INPUT],
    }
    return _function(tool.name, tool.description, parameters)


def chat_tools(tools: list[Tool]) -> tuple[list[dict[str, Any]], dict[str, ToolRoute]]:
    """The policy's function tools, in the request's order (namespaces flattened in place), and routes."""
    out: list[dict[str, Any]] = []
    routes: dict[str, ToolRoute] = {}
    where: dict[str, str] = {}

    def add(name: str, route: ToolRoute, fn: dict[str, Any], at: str) -> None:
        if name in routes:
            raise ToolNameCollisionError(
                f"{at} is named {name!r} like {where[name]}; the policy calls tools by name only "
                "(namespaces are not part of the name it writes): rename one of them",
                param=at,
            )
        routes[name], where[name] = route, at
        out.append(fn)

    for i, tool in enumerate(tools):
        if isinstance(tool, FunctionTool):
            add(
                tool.name,
                ToolRoute("function"),
                _function(tool.name, tool.description, tool.parameters),
                f"tools[{i}]",
            )
        elif isinstance(tool, NamespaceTool):
            for j, fn in enumerate(tool.tools):
                body = _function(fn.name, fn.description, fn.parameters)
                add(fn.name, ToolRoute("function", tool.name), body, f"tools[{i}].tools[{j}]")
        else:
            add(tool.name, ToolRoute("custom"), _custom_function(tool), f"tools[{i}]")
    return out, routes


# ------------------------------------------------------------------------------------------- items


def _tool_call(item: FunctionCallItem | CustomToolCallItem) -> dict[str, Any]:
    if isinstance(item, FunctionCallItem):
        arguments = item.arguments
    else:
        arguments = json.dumps({CUSTOM_INPUT: item.input}, ensure_ascii=False)
    return {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}


class _Messages:
    """Builds the chat messages item by item, checking each output against its call."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sources: list[str] = []
        self.calls: dict[str, tuple[str, str]] = {}  # call_id -> (item type, where: `input[i]`...)
        self.answered: dict[str, str] = {}  # call_id -> where its output is
        self.open_turn: dict[str, Any] | None = None  # the assistant message calls may still join

    def history(self, previous: PreviousResponse, routes: dict[str, ToolRoute]) -> None:
        """The previous response's history first, its calls and outputs known as if sent as items."""
        for message in copy.deepcopy(previous.messages):  # calls may join its last turn: never the record
            self.add(message, PREVIOUS)
            assistant = message.get("role") == "assistant"
            for call in (message.get("tool_calls") or []) if assistant else []:
                self.calls[str(call.get("id"))] = (call_item(call, routes)["type"], PREVIOUS)
            if message.get("role") == "tool":
                self.answered[str(message.get("tool_call_id"))] = PREVIOUS
            self.open_turn = message if assistant else None

    def message(self, item: MessageItem, i: int) -> None:
        where = f"input[{i}].content"
        if item.role == "assistant":
            msg = {"role": "assistant", "content": text_parts(item.content, where, "output_text")}
            self.add(msg, f"input[{i}]")
            self.open_turn = msg
            return
        role = "user" if item.role == "user" else "system"
        self.add({"role": role, "content": text_parts(item.content, where, "input_text")}, f"input[{i}]")
        self.open_turn = None

    def add(self, message: dict[str, Any], source: str) -> None:
        self.messages.append(message)
        self.sources.append(source)

    def call(self, item: FunctionCallItem | CustomToolCallItem, i: int) -> None:
        if item.call_id in self.calls:
            raise DuplicateCallIdError(
                f"input[{i}] ({item.type}) reuses call_id {item.call_id!r} of "
                f"{self.calls[item.call_id][1]}; each call needs its own id",
                param=f"input[{i}].call_id",
            )
        self.calls[item.call_id] = (item.type, f"input[{i}]")
        if self.open_turn is None:
            self.open_turn = {"role": "assistant", "content": None}
            self.add(self.open_turn, f"input[{i}]")
        self.open_turn.setdefault("tool_calls", []).append(_tool_call(item))

    @staticmethod
    def _check_kind(
        item: FunctionCallOutputItem | CustomToolCallOutputItem, i: int, kind: str, where: str
    ) -> None:
        expected = "function_call_output" if kind == "function_call" else "custom_tool_call_output"
        if item.type != expected:
            raise MismatchedToolOutputError(
                f"input[{i}] is a {item.type} for call_id {item.call_id!r}, but that call ({where}) "
                f"is a {kind}; answer it with a {expected}",
                param=f"input[{i}].type",
            )

    def output(
        self, item: FunctionCallOutputItem | CustomToolCallOutputItem, i: int, *, pending: bool = False
    ) -> None:
        """`pending`: the previous response's history is not read yet, so an output may answer one of its
        calls (checked again once it is: gateway/pipeline/previous_response.py)."""
        at = f"input[{i}].call_id"
        call = self.calls.get(item.call_id)
        if call is not None:
            self._check_kind(item, i, *call)
        elif not pending:
            raise UnmatchedToolOutputError(
                f"input[{i}] ({item.type}) answers call_id {item.call_id!r}, which no earlier "
                "function_call or custom_tool_call in the input (or the history of previous_response_id) "
                "has; send the call before its output (the whole history, as the gateway returned it)",
                param=at,
            )
        if item.call_id in self.answered:
            raise DuplicateCallIdError(
                f"input[{i}] answers call_id {item.call_id!r} again ({self.answered[item.call_id]} "
                "already did); send one output per call",
                param=at,
            )
        self.answered[item.call_id] = f"input[{i}]"
        content = text_parts(item.output, f"input[{i}].output", "input_text")
        self.add({"role": "tool", "tool_call_id": item.call_id, "content": content}, f"input[{i}]")
        self.open_turn = None


def _check_instructions(request: ResponsesRequest, previous: PreviousResponse) -> None:
    first = previous.messages[0] if previous.messages else {}
    if first.get("role") == "system" and first.get("content") == request.instructions:
        return
    raise ChangedInstructionsError(
        f"instructions differ from the first message of the history of previous_response_id "
        f"{previous.ref.response_id!r} (call {previous.ref.call_id!r}): that call was sampled on its own "
        "instructions, which the continuation keeps. Leave `instructions` out (or send the same text), or "
        "send the whole history with the new instructions as `input` without previous_response_id",
        param="instructions",
    )


def chat_form(request: ResponsesRequest, previous: PreviousResponse | None = None) -> ChatForm:
    """The request's chat messages and function tools (module docstring); raises the typed error of the
    first item or tool that breaks a rule, naming it. A request with `previous_response_id` and no
    `previous` (its history not read yet) gives the form of its own items only, an output of a call it
    does not hold unchecked until then: `AcceptedResponses.canonical` refuses to capture that form."""
    tools, routes = chat_tools(request.tool_list)
    built = _Messages()
    pending = request.previous_response_id is not None and previous is None
    if previous is not None:
        if previous.ref.response_id != request.previous_response_id:
            raise ValueError(f"{previous.ref} is not the history of {request.previous_response_id!r}")
        if request.instructions is not None:
            _check_instructions(request, previous)
        built.history(previous, routes)
    elif request.instructions is not None:
        built.add({"role": "system", "content": request.instructions}, "instructions")
    for i, item in enumerate(request.items):
        if isinstance(item, MessageItem):
            built.message(item, i)
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            built.call(item, i)
        else:
            built.output(item, i, pending=pending)
    return ChatForm(messages=built.messages, tools=tools or None, routes=routes, sources=built.sources)


@dataclass(frozen=True)
class AcceptedResponses:
    """A Responses request the gateway took: the request and its chat form (the way back included);
    `previous`: the history its `previous_response_id` names, once read."""

    request: ResponsesRequest
    form: ChatForm
    previous: PreviousResponse | None = None

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def pending(self) -> bool:
        """It names a previous response whose history is not read yet (`continuing` reads it in)."""
        return self.request.previous_response_id is not None and self.previous is None

    def continuing(self, previous: PreviousResponse) -> AcceptedResponses:
        """The request with its previous response's history in front of its items (module docstring)."""
        return accept(self.request, previous)

    def canonical(self) -> CaptureRequest:
        """The request as the capture pipeline consumes it (gateway/intake/capture_request.py)."""
        if self.pending:
            raise UnresolvedPreviousResponseError(
                f"previous_response_id {self.request.previous_response_id!r} was not read before capture"
            )
        r = self.request
        return CaptureRequest(
            messages=self.form.messages,
            tools=self.form.tools,
            overrides=SamplingOverrides(r.temperature, r.top_p, r.max_output_tokens),
            stream=r.stream,
            wire=WireFormat.RESPONSES,
        )


def accept(request: ResponsesRequest, previous: PreviousResponse | None = None) -> AcceptedResponses:
    return AcceptedResponses(request, chat_form(request, previous), previous)


def chat_body(request: ResponsesRequest, form: ChatForm) -> dict[str, Any]:
    """The chat-completions body of the request (for the chat path's own checks and capture)."""
    body: dict[str, Any] = {"model": request.model, "messages": form.messages, "stream": request.stream}
    if form.tools:
        body["tools"] = form.tools
    for name, value in (
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("max_tokens", request.max_output_tokens),
    ):
        if value is not None:
            body[name] = value
    return body


# ------------------------------------------------------------------------------------------- way back


def call_item(call: dict[str, Any], routes: dict[str, ToolRoute]) -> dict[str, Any]:
    """The Responses item (without its item id) of one tool call the policy wrote (module docstring)."""
    fn = call.get("function") or {}
    name, arguments = str(fn.get("name", "")), fn.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    route = routes.get(name)
    if route is not None and route.kind == "custom":
        text = _custom_input(arguments)
        if text is not None:
            return {"type": "custom_tool_call", "call_id": call["id"], "name": name, "input": text}
    item = {"type": "function_call", "call_id": call["id"], "name": name, "arguments": arguments}
    if route is not None and route.namespace is not None:
        item["namespace"] = route.namespace
    return item


def _custom_input(arguments: str) -> str | None:
    """The free-form input of a custom tool call's arguments, if they are exactly {"input": <string>}."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {CUSTOM_INPUT} and isinstance(parsed[CUSTOM_INPUT], str):
        return parsed[CUSTOM_INPUT]
    return None
