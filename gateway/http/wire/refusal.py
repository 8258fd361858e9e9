"""A refusal as every wire format sees it, and the shape a wire format renders it in.

gateway/http/routes/errors.py turns a domain exception into a `Refusal` (its HTTP status, its kind in
OpenAI's vocabulary, its code, message and param); each wire format's `ErrorShape` renders a refusal as
its JSON error body and, for a stream whose delivery was refused, as its error event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from starlette.responses import JSONResponse


@dataclass(frozen=True)
class Refusal:
    """What went wrong, wire-neutral: `kind` is the OpenAI error type (`invalid_request_error`,
    `authentication_error`, `permission_error`, `not_found_error`, `conflict_error`,
    `rate_limit_error`, `server_error`), `code` the exception's class name or a code clients know."""

    status: int
    kind: str
    code: str
    message: str
    param: str | None = None
    retry_after: int | None = None  # a "not yet" that clears by itself: when to retry

    @property
    def headers(self) -> dict[str, str] | None:
        return {"retry-after": str(self.retry_after)} if self.retry_after is not None else None


class ErrorShape(Protocol):
    """How a wire format renders a refusal."""

    def response(self, refusal: Refusal) -> JSONResponse:
        """The JSON error answer."""
        ...

    def event(self, refusal: Refusal) -> bytes:
        """The server-sent event that ends a stream whose last part was refused."""
        ...
