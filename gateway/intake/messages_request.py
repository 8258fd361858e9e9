"""What the Anthropic Messages wire accepts (`MessagesRequest`, `POST /v1/messages` and its
`count_tokens`), and its canonical form (gateway/intake/capture_request.py; the blocks' mapping to the
policy's chat form is gateway/intake/messages_blocks.py).

Only what the learner can mirror is accepted: `temperature`, `top_p` and `max_tokens` become the call's
SamplingConfig. Refused with a 400 that names the parameter: `top_k`, `stop_sequences` (stop strings cut
completions off the token stream), forced or forbidden tools (`tool_choice` other than `auto`, which
needs constrained decoding), server tools and MCP servers (grove runs no tools), and `thinking` of type
`enabled` (a thinking budget the sampler does not enforce; Claude Code: `CLAUDE_CODE_DISABLE_THINKING=1`).
`thinking` `disabled` and `adaptive` are accepted: the policy decides by itself whether to reason, and
what it writes, reasoning included, comes back as its text (no `thinking` blocks). Accepted without
effect on sampling: `metadata`, `context_management` (the gateway never edits the history it is sent),
`output_config` (an effort hint for Anthropic's models), `service_tier`. Unknown parameters are refused
(fail closed).

Pure module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gateway.intake.capture_request import CaptureRequest, SamplingOverrides, WireFormat
from gateway.intake.chat_request import UnknownModelError
from gateway.intake.context_window import check_max_tokens
from gateway.intake.limits import RequestLimits, check_counts, parse_json
from gateway.intake.messages_blocks import (
    InvalidMessagesRequestError,
    MessagesRequestError,
    chat_messages,
    chat_tools,
)

# Accepted and without effect on sampling.
IGNORED = frozenset({"metadata", "context_management", "output_config", "service_tier"})
THINKING = frozenset({"disabled", "adaptive"})  # accepted `thinking` types (module docstring)
# name -> (is the value harmless?, why it is refused otherwise)
_NO_EFFECT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "top_k": (lambda v: v is None, "top_k is not mirrored by the learner; use top_p"),
    "stop_sequences": (lambda v: not v, "stop sequences cut completions off the token stream; not supported"),
    "tool_choice": (
        lambda v: v is None or (isinstance(v, dict) and v.get("type") == "auto"),
        "only tool_choice {'type': 'auto'}: forcing or forbidding tools needs constrained decoding",
    ),
    "mcp_servers": (lambda v: not v, "grove runs no MCP servers for the model; run the tools in the harness"),
    "container": (lambda v: v is None, "grove runs no code-execution container"),
    "thinking": (
        lambda v: v is None or (isinstance(v, dict) and v.get("type") in THINKING),
        "a thinking budget is not enforced by grove's sampler: the policy reasons (or not) by itself. Send "
        "thinking {'type': 'disabled'} or {'type': 'adaptive'} (Claude Code: CLAUDE_CODE_DISABLE_THINKING=1)",
    ),
}
_FIELDS = frozenset({"model", "messages", "system", "tools", "max_tokens", "stream", "temperature", "top_p"})
_TOOL_KEYS = frozenset({"name", "description", "input_schema", "cache_control", "type", "defer_loading"})


class UnsupportedMessagesParameterError(MessagesRequestError):
    """A parameter the learner cannot mirror, or one the gateway does not know."""


class UnsupportedToolError(MessagesRequestError):
    """A tool definition grove cannot offer the policy: a server tool, or one with unknown fields."""


class MessagesRequest(BaseModel):
    """A Messages request (`max_tokens` is required, except when counting tokens)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    _chat: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _tools: list[dict[str, Any]] | None = PrivateAttr(default=None)

    @field_validator("temperature", "top_p", "max_tokens", mode="before")
    @classmethod
    def _not_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # JSON true/false: pydantic would take it as 1 / 0
            raise ValueError(f"{value!r} is a boolean; give a number")
        return value

    def canonical(self) -> CaptureRequest:
        """The request as the capture pipeline consumes it."""
        return CaptureRequest(
            messages=self._chat,
            tools=self._tools,
            overrides=SamplingOverrides(
                temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens
            ),
            stream=self.stream,
            wire=WireFormat.ANTHROPIC_MESSAGES,
        )


def _check_parameters(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name in _FIELDS or name in IGNORED:
            continue
        if name not in _NO_EFFECT:
            raise UnsupportedMessagesParameterError(
                f"parameter {name!r} is not supported by the grove gateway; accepted: "
                f"{sorted(_FIELDS | IGNORED)} (and {sorted(_NO_EFFECT)} only at their no-op values)",
                param=name,
            )
        harmless, why = _NO_EFFECT[name]
        if not harmless(value):
            raise UnsupportedMessagesParameterError(
                f"parameter {name}={value!r} is not supported: {why}", param=name
            )


def _check_tools(tools: list[dict[str, Any]] | None) -> None:
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if tool.get("type") not in (None, "custom"):
            raise UnsupportedToolError(
                f"{where} is a server tool of type {tool.get('type')!r}; grove runs no tools for the model. "
                "Offer it as a custom tool ({'name', 'description', 'input_schema'}) the harness runs",
                param=f"{where}.type",
            )
        unknown = set(tool) - _TOOL_KEYS
        if unknown:
            raise UnsupportedToolError(
                f"{where} has fields {sorted(unknown)} the grove gateway does not take; accepted: "
                f"{sorted(_TOOL_KEYS)}",
                param=f"{where}.{sorted(unknown)[0]}",
            )
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise InvalidMessagesRequestError(
                f"{where} needs a string 'name' and an object 'input_schema'", param=where
            )


def parse_messages_request(body: Any, served_model: str, *, counting: bool = False) -> MessagesRequest:
    """Validate a decoded JSON body (`counting`: a count_tokens body, without `max_tokens`); raises a
    MessagesRequestError subclass naming the bad field, nothing admitted."""
    if not isinstance(body, dict):
        raise InvalidMessagesRequestError("the request body must be a JSON object")
    try:
        request = MessagesRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidMessagesRequestError(f"invalid request: {where}: {first['msg']}", param=where) from None
    if request.max_tokens is None and not counting:
        raise InvalidMessagesRequestError("max_tokens: Field required", param="max_tokens")
    _check_parameters(body)
    _check_tools(request.tools)
    request._chat = chat_messages(request.system, request.messages)
    request._tools = chat_tools(request.tools)
    if request.messages[-1].get("role") == "assistant":
        raise InvalidMessagesRequestError(
            "the last message is the assistant's (a prefill): grove samples a whole new assistant turn and "
            "does not continue a partial one; end the messages with a user message",
            param=f"messages[{len(request.messages) - 1}]",
        )
    if request.model != served_model:
        raise UnknownModelError(
            f"model {request.model!r} is not served here; this gateway serves {served_model!r} "
            "(Claude Code: --model <that name>)",
            param="model",
        )
    return request


def check_messages_body(
    raw: bytes, limits: RequestLimits, served_model: str, max_model_len: int
) -> MessagesRequest:
    """A Messages body's checks before admission, in order; the first problem raises its RequestError."""
    body = parse_json(raw, limits)
    if isinstance(body, dict):
        check_counts(body, limits)
    request = parse_messages_request(body, served_model)
    check_max_tokens(request, max_model_len, ("max_tokens",))
    return request


def check_count_tokens_body(
    raw: bytes, limits: RequestLimits, served_model: str, max_model_len: int
) -> MessagesRequest:
    """A count_tokens body's checks (a Messages body without `max_tokens`)."""
    body = parse_json(raw, limits)
    if isinstance(body, dict):
        check_counts(body, limits)
    return parse_messages_request(body, served_model, counting=True)
