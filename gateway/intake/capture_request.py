"""The canonical request: what the capture pipeline consumes, whichever wire format carried it.

A wire format (gateway/intake/chat_request.py, gateway/intake/messages_request.py) checks its own
body and turns it into one `CaptureRequest`:

- `messages`: the conversation in the policy's chat form, the form its chat template renders and the
  chat records keep (OpenAI-style roles `system`/`user`/`assistant`/`tool`, assistant `tool_calls` whose
  `arguments` are JSON text); continuation, routing and the exact splice are decided on these;
- `tools`: the tool list in the same form (`{"type": "function", "function": {...}}`), or None;
- `overrides`: the sampling parameters the request sets (temperature, top_p, max_tokens), applied on
  top of the episode's sampling (`SamplingOverrides.apply`); anything the learner cannot mirror was
  refused by the wire format already;
- `stream`: whether the answer goes back as events;
- `wire`: which wire format it came from (the answer is rendered back in it).

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from pydantic import ValidationError

from grove.sampling import MIN_TEMPERATURE, SamplingConfig


class RequestError(ValueError):
    """Base of bad requests, whatever their wire format (HTTP 400 unless a subclass says otherwise);
    `param` names the field that is wrong."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidSamplingError(RequestError):
    """Sampling values outside what grove samples with (e.g. temperature 0)."""


class WireFormat(StrEnum):
    """The HTTP APIs the gateway speaks."""

    CHAT_COMPLETIONS = "chat_completions"  # OpenAI POST /v1/chat/completions
    ANTHROPIC_MESSAGES = "anthropic_messages"  # Anthropic POST /v1/messages
    RESPONSES = "responses"  # OpenAI POST /v1/responses (Codex CLI)


@dataclass(frozen=True)
class SamplingOverrides:
    """The sampling parameters a request sets (None: the episode's)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None

    def apply(self, base: SamplingConfig) -> SamplingConfig | None:
        """The call's SamplingConfig: `base` (the episode's) with these overrides; None if none."""
        overrides = {k: v for k, v in vars(self).items() if v is not None}
        if not overrides:
            return None
        if self.temperature is not None and self.temperature < MIN_TEMPERATURE:
            raise InvalidSamplingError(
                f"temperature={self.temperature} is not supported: grove samples with temperature >= "
                f"{MIN_TEMPERATURE} (greedy decoding records no usable behaviour logprobs)",
                param="temperature",
            )
        try:
            return SamplingConfig.model_validate({**base.model_dump(), **overrides})
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidSamplingError(f"invalid sampling: {where}: {first['msg']}", param=where) from None


@dataclass(frozen=True)
class CaptureRequest:
    """One request of a harness as the capture pipeline consumes it (module docstring)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    overrides: SamplingOverrides
    stream: bool
    wire: WireFormat

    def canonical(self) -> CaptureRequest:
        return self


class WireRequest(Protocol):
    """A request as a wire format accepted it: it knows its canonical form."""

    def canonical(self) -> CaptureRequest: ...
