"""Size and shape limits of everything a client sends the gateway, enforced before anything is admitted.

Every boundary has a limit (docs/gateway.md, "Limits"), and each refusal names it and its setting:

- headers: count and total bytes (with the request target), checked by `HeaderLimitMiddleware` before
  any route runs: 431 `HeadersTooLargeError`;
- bodies: routes never let FastAPI read a body for them; `read_body` runs *after* the bearer token
  was checked, refuses a declared Content-Length over the route's cap without reading a byte, and
  streams the rest with a running count: 413 `RequestTooLargeError` at the first byte over the cap.
  So an unauthenticated or oversized body costs the gateway at most one cap of memory. Large chat
  bodies are admitted before they are read (gateway/intake/large_bodies.py);
- JSON: nesting depth (a deep body fails in Temporal's converter, not here) and lone surrogates
  (text that cannot be encoded as UTF-8, again failing later): 400 `InvalidJsonError` with the path.

The numbers live in `RequestLimits` (gateway/http/settings.py holds one); docs/gateway.md lists them.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.intake.capture_request import RequestError
from gateway.intake.chat_request import InvalidChatRequestError

MiB = 2**20
_SURROGATE = re.compile("[\ud800-\udfff]")


class RequestLimits(BaseModel):
    """What one request may hold. Defaults fit a long agent episode of a small-context model; each
    refusal says which field to raise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # A 128k-token conversation is ~0.5-1 MB of JSON. The messages go to the object store, the `call`
    # Update carries a reference (capture/claims.py), so Temporal's 2 MB payload limit is not the bound;
    # the gateway's memory per request is (a few times the parsed body).
    max_body_bytes: int = Field(4 * MiB, ge=1024)
    max_close_bytes: int = Field(256 * 1024, ge=1024)  # final answer + agents' outputs, one Update
    max_header_bytes: int = Field(32 * 1024, ge=1024)  # all header names + values + the request target
    max_headers: int = Field(100, ge=8)
    max_json_depth: int = Field(64, ge=4)  # OpenCode's deepest tool schema nests ~10 levels
    max_messages: int = Field(4096, ge=1)
    max_tools: int = Field(256, ge=0)
    # Slow clients (docs/gateway.md, "Slow clients"): a request head (line + headers) must be complete
    # this long after its connection or its first byte (gateway/http/slow_clients.py), else the connection is
    # closed (408); a body must arrive at `min_upload_bytes_per_s` on average once `upload_grace_s` has
    # passed, else 408 SlowUploadError, and what it held (its episode's turn, the large-body budget) is
    # freed for others.
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    min_upload_bytes_per_s: int = Field(16 * 1024, ge=1)
    upload_grace_s: float = Field(10.0, gt=0, le=3600)


class RequestTooLargeError(RequestError):
    """A body over its route's byte cap (HTTP 413)."""


class SlowUploadError(RequestError):
    """A body that arrived below the minimum upload rate (HTTP 408)."""


class HeadersTooLargeError(RequestError):
    """Too many headers, or too many header bytes (HTTP 431)."""


class InvalidJsonError(RequestError):
    """A body that is JSON but not one the gateway can carry: too deep, or text with lone surrogates."""


class InvalidBodyError(RequestError):
    """A management request body (close) that is not the model it must be."""


class TooManyItemsError(RequestError):
    """More messages or tools than the gateway accepts in one request."""


def declared_size(request: Request, limit: int, setting: str) -> int | None:
    """The body's declared Content-Length (None: not declared, e.g. chunked); RequestTooLargeError when
    it is over `limit`, before a byte is read."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        return None
    if int(declared) > limit:
        raise _too_large(int(declared), limit, setting, declared=True)
    return int(declared)


async def read_body(request: Request, limit: int, setting: str, limits: RequestLimits) -> bytes:
    """The request's body, read only up to `limit` bytes (RequestTooLargeError beyond), at the minimum
    upload rate (SlowUploadError below it): by `upload_grace_s` + n / `min_upload_bytes_per_s` seconds
    after the read began, more than n bytes must have arrived (or the whole body)."""
    declared_size(request, limit, setting)
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream = request.stream()
    while True:
        deadline = started + limits.upload_grace_s + size / limits.min_upload_bytes_per_s
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await anext(stream)
        except StopAsyncIteration:
            return b"".join(chunks)
        except TimeoutError:
            raise _too_slow(size, loop.time() - started, limits) from None
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit, setting, declared=False)
        chunks.append(chunk)


def _too_slow(size: int, seconds: float, limits: RequestLimits) -> SlowUploadError:
    return SlowUploadError(
        f"the request body arrived too slowly: {size} bytes in {seconds:.1f} s; this gateway needs at least "
        f"{limits.min_upload_bytes_per_s} bytes/s after the first {limits.upload_grace_s:g} s "
        "(min_upload_bytes_per_s, upload_grace_s), so that a slow client cannot hold what other requests "
        "wait for. Send the request again over a faster connection",
        param="min_upload_bytes_per_s",
    )


def _too_large(size: int, limit: int, setting: str, *, declared: bool) -> RequestTooLargeError:
    what = f"declares {size} bytes" if declared else f"has more than {limit} bytes (read {size})"
    return RequestTooLargeError(
        f"the request body {what}; this gateway accepts at most {limit} bytes here ({setting} = {limit}). "
        "Send less (compact the history), or raise the gateway's limit",
        param=setting,
    )


def parse_json(raw: bytes, limits: RequestLimits) -> Any:
    """Decode a JSON body and check its depth and text (InvalidJsonError naming the first problem)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _too_deep("", limits.max_json_depth) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidChatRequestError(f"the request body is not valid JSON: {err}") from None
    check_json(value, limits.max_json_depth)
    return value


def _too_deep(path: str, limit: int) -> InvalidJsonError:
    return InvalidJsonError(
        f"the request body nests deeper than {limit} levels{f' at {path}' if path else ''} "
        f"(max_json_depth = {limit}); no chat request needs that: flatten the value",
        param=path or None,
    )


def check_json(value: Any, max_depth: int) -> None:
    """Depth and text check of a decoded JSON value, iterative (a deep value must not recurse here)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise _too_deep(path, max_depth)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_text(key, f"a key of {path or 'the body'}")
                stack.append((child, _child_path(path, key), depth + 1))


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _check_text(text: str, path: str) -> None:
    found = None if text.isascii() else _SURROGATE.search(text)
    if found is not None:
        raise InvalidJsonError(
            f"{path or 'the body'} holds a lone UTF-16 surrogate (U+{ord(found.group()):04X} at character "
            f"{found.start()}): it is not text and cannot be encoded as UTF-8; send valid Unicode (a "
            "surrogate pair escapes one character above U+FFFF)",
            param=path or None,
        )


def check_counts(body: dict[str, Any], limits: RequestLimits) -> None:
    """Message and tool counts (before the request is validated field by field)."""
    for field, limit, setting in (
        ("messages", limits.max_messages, "max_messages"),
        ("tools", limits.max_tools, "max_tools"),
    ):
        items = body.get(field)
        if isinstance(items, list) and len(items) > limit:
            raise TooManyItemsError(
                f"the request has {len(items)} {field}; this gateway accepts at most {limit} ({setting} = "
                f"{limit}). Compact the history or send fewer {field}",
                param=field,
            )


class HeaderLimitMiddleware:
    """431 for a request with too many headers or header bytes, before any route (pure ASGI)."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._check(scope)
            if error is not None:
                body = {
                    "error": {
                        "message": str(error),
                        "type": "invalid_request_error",
                        "param": error.param,
                        "code": type(error).__name__,
                    }
                }
                await JSONResponse(body, status_code=431)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> HeadersTooLargeError | None:
        headers = scope.get("headers") or []
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(k) + len(v) for k, v in headers)
        if len(headers) > self.limits.max_headers:
            return HeadersTooLargeError(
                f"the request has {len(headers)} headers; this gateway accepts at most "
                f"{self.limits.max_headers} (max_headers = {self.limits.max_headers})",
                param="max_headers",
            )
        if size > self.limits.max_header_bytes:
            return HeadersTooLargeError(
                f"the request's headers and target hold {size} bytes; this gateway accepts at most "
                f"{self.limits.max_header_bytes} (max_header_bytes = {self.limits.max_header_bytes})",
                param="max_header_bytes",
            )
        return None
