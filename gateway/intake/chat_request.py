"""What the OpenAI chat-completions wire accepts (`ChatCompletionRequest`), and its canonical form
(gateway/intake/capture_request.py): the messages and tools are already the policy's chat form, so
`canonical()` passes them on and maps the sampling parameters.

Only what the learner can mirror is accepted: temperature, top_p and max_tokens /
max_completion_tokens become the call's SamplingConfig (grove/sampling.py); anything that
changes the sampled distribution in a way the learner does not reproduce (n > 1, logit_bias,
penalties, top_k, min_p, stop strings, seeds, constrained output, forced tool choice, logprobs)
is refused with a 400 that names the parameter. Unknown parameters are refused too (fail closed).

Pure module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.intake.capture_request import CaptureRequest, RequestError, SamplingOverrides, WireFormat
from gateway.intake.capture_request import InvalidSamplingError as InvalidSamplingError  # the chat wire's too
from grove.sampling import SamplingConfig

ROLES = frozenset({"system", "user", "assistant", "tool"})
# Accepted and without effect on sampling.
IGNORED = frozenset({"user", "metadata", "store", "parallel_tool_calls", "stream_options"})
# name -> (is the value harmless?, why it is refused otherwise)
_NO_EFFECT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v in (None, 1), "one choice per request (n=1): each choice is its own call"),
    "logit_bias": (lambda v: not v, "logit_bias changes the distribution the learner recomputes"),
    "presence_penalty": (lambda v: not v, "penalties change the distribution the learner recomputes"),
    "frequency_penalty": (lambda v: not v, "penalties change the distribution the learner recomputes"),
    "repetition_penalty": (lambda v: v in (None, 1, 1.0), "penalties change the sampled distribution"),
    "top_k": (lambda v: v in (None, 0, -1), "top_k is not mirrored by the learner; use top_p"),
    "min_p": (lambda v: not v, "min_p is not mirrored by the learner; use top_p"),
    "logprobs": (lambda v: not v, "the gateway does not return logprobs (grove records them itself)"),
    "top_logprobs": (lambda v: not v, "the gateway does not return logprobs (grove records them itself)"),
    "stop": (lambda v: not v, "stop strings cut completions off the token stream; not supported"),
    "seed": (lambda v: v is None, "grove seeds every call itself (a pure function of the call id)"),
    "response_format": (
        lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
        "constrained output changes the distribution the learner recomputes",
    ),
    "tool_choice": (
        lambda v: v in (None, "auto"),
        "only tool_choice 'auto': forcing or forbidding tools needs constrained decoding",
    ),
    "functions": (lambda v: not v, "the legacy `functions` API; send `tools`"),
    "function_call": (lambda v: not v, "the legacy `function_call` API; send `tools`"),
}
_FIELDS = frozenset(
    {"model", "messages", "tools", "stream", "temperature", "top_p", "max_tokens", "max_completion_tokens"}
)


class ChatRequestError(RequestError):
    """Base of bad chat requests (HTTP 400 unless a subclass says otherwise)."""


class InvalidChatRequestError(ChatRequestError):
    """A body that is not a valid chat-completions request (bad JSON, missing or malformed fields)."""


class UnsupportedParameterError(ChatRequestError):
    """A parameter the learner cannot mirror, or one the gateway does not know."""


class UnsupportedContentError(ChatRequestError):
    """A content part the served (text-only) model cannot take: image, audio, file, ..."""


class UnknownModelError(ChatRequestError):
    """A model name the gateway does not serve (HTTP 404)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @field_validator("temperature", "top_p", "max_tokens", "max_completion_tokens", mode="before")
    @classmethod
    def _not_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # JSON true/false: pydantic would take it as 1 / 0
            raise ValueError(f"{value!r} is a boolean; give a number")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def canonical(self) -> CaptureRequest:
        """The request as the capture pipeline consumes it."""
        return CaptureRequest(
            messages=self.messages,
            tools=self.tools,
            overrides=overrides_of(self),
            stream=self.stream,
            wire=WireFormat.CHAT_COMPLETIONS,
        )


def _check_parameters(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name in _FIELDS or name in IGNORED:
            continue
        if name not in _NO_EFFECT:
            raise UnsupportedParameterError(
                f"parameter {name!r} is not supported by the grove gateway; accepted: "
                f"{sorted(_FIELDS | IGNORED)} (and {sorted(_NO_EFFECT)} only at their no-op values)",
                param=name,
            )
        harmless, why = _NO_EFFECT[name]
        if not harmless(value):
            raise UnsupportedParameterError(f"parameter {name}={value!r} is not supported: {why}", param=name)


def _check_messages(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise InvalidChatRequestError(
                f"messages[{i}].role is {role!r}; expected one of {sorted(ROLES)}",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidChatRequestError(
                f"messages[{i}].content must be a string, a list of parts or null",
                param=f"messages[{i}].content",
            )
        if isinstance(content, list):
            _check_parts(i, role, content)


def _check_parts(i: int, role: str, parts: list[Any]) -> None:
    """Only text parts: the served model reads text (an image part would fail in the chat template,
    after admission)."""
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise UnsupportedContentError(
                f"messages[{i}] ({role}) has a content part of type {kind!r} at content[{j}]; the grove "
                "gateway serves a text-only model and accepts only 'text' parts. Send the text, or "
                "describe the image/audio/file in words",
                param=f"messages[{i}].content[{j}].type",
            )
        if not isinstance(part.get("text"), str):
            raise InvalidChatRequestError(
                f"messages[{i}].content[{j}] is a text part without a string 'text'",
                param=f"messages[{i}].content[{j}].text",
            )


def parse_chat_request(body: Any, served_model: str) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raises a ChatRequestError subclass naming the bad field."""
    if not isinstance(body, dict):
        raise InvalidChatRequestError("the request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidChatRequestError(f"invalid request: {where}: {first['msg']}", param=where) from None
    _check_parameters(body)
    _check_messages(request.messages)
    if request.model != served_model:
        raise UnknownModelError(
            f"model {request.model!r} is not served here; this gateway serves {served_model!r}", param="model"
        )
    return request


def overrides_of(request: ChatCompletionRequest) -> SamplingOverrides:
    """The request's sampling parameters; max_tokens and max_completion_tokens are one budget."""
    if (
        request.max_tokens
        and request.max_completion_tokens
        and request.max_tokens != request.max_completion_tokens
    ):
        raise InvalidSamplingError(
            f"max_tokens={request.max_tokens} and max_completion_tokens={request.max_completion_tokens} "
            "disagree; send one of them",
            param="max_completion_tokens",
        )
    return SamplingOverrides(
        temperature=request.temperature,
        top_p=request.top_p,
        max_tokens=request.max_completion_tokens or request.max_tokens,
    )


def sampling_for(request: ChatCompletionRequest, base: SamplingConfig) -> SamplingConfig | None:
    """The call's SamplingConfig: the episode's (`base`) with the request's overrides; None if none."""
    return overrides_of(request).apply(base)
