"""Domain exceptions -> refusals: the only place where gateway errors get HTTP codes.

Each exception becomes a `Refusal` (gateway/http/wire/refusal.py): a status, a kind, `code` = the
exception's class name (for an Update the workflow refused: the ledger's named error), message and
param. The route's wire format renders it in its own error shape: a route of a wire format is a
`wire_route(shape)` (its APIRouter's `route_class`), and the handlers here find the shape on the route
that matched; anything else (no route matched, management routes) answers in OpenAI's shape
(gateway/http/wire/chat_completions.py: `{"error": {"message", "type", "param", "code"}}`). An
unexpected exception becomes a 500 that names only an incident id; its traceback goes to the gateway's
log, never to the client.
"""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from capture.records import CorruptChatRecordError
from chat.content_tokens import ControlTextError, UnsupportedTokenizerError
from chat.render import (
    ChatRenderError,
    NoChatTemplateError,
    UndeclaredDiscontinuityError,
)
from gateway.http.auth import MalformedTokenError, MissingTokenError, WrongEpisodeTokenError
from gateway.http.episode_ref import InvalidEpisodeRefError
from gateway.http.wire.anthropic_messages import UnrenderableToolCallError
from gateway.http.wire.chat_completions import OPENAI_ERRORS
from gateway.http.wire.refusal import ErrorShape, Refusal
from gateway.intake.body_parse import BodyWorkerLostError
from gateway.intake.capture_request import RequestError
from gateway.intake.chat_request import UnknownModelError
from gateway.intake.large_bodies import LargeBodyBacklogError
from gateway.intake.limits import HeadersTooLargeError, RequestTooLargeError, SlowUploadError
from gateway.intake.tokenization import TokenizerBusyError
from gateway.pipeline.capture_errors import (
    ContextConflictError,
    DeliveryRefusedError,
    EpisodeClosedError,
    ForeignSessionError,
    HeadPendingError,
    MissingRecordError,
    ResponsePendingError,
    TokenCountUnavailableError,
    UndeliveredHeadsError,
    UnspawnedAgentError,
)
from gateway.pipeline.identity import InvalidIdentityHeaderError
from gateway.pipeline.launch_records import InvalidLaunchHeaderError
from gateway.pipeline.routing import ContextOwnershipError, RoutingError
from gateway.temporal.episode_client import (
    EpisodeFailedError,
    EpisodeNotFoundError,
    EpisodeQueryError,
    EpisodeUpdateRejectedError,
    NotExternalEpisodeError,
    TemporalUnavailableError,
)
from grove.episode_start import EpisodeIdReusedError
from storage.base import StorageError

log = logging.getLogger("grove.gateway")

# Most specific first is not needed: the lookup walks the exception's MRO.
STATUS: dict[type[Exception], tuple[int, str]] = {
    InvalidEpisodeRefError: (404, "not_found_error"),
    MissingTokenError: (401, "authentication_error"),
    MalformedTokenError: (401, "authentication_error"),
    WrongEpisodeTokenError: (403, "permission_error"),
    UnknownModelError: (404, "not_found_error"),
    RequestTooLargeError: (413, "invalid_request_error"),
    SlowUploadError: (408, "invalid_request_error"),
    HeadersTooLargeError: (431, "invalid_request_error"),
    RequestError: (400, "invalid_request_error"),
    InvalidIdentityHeaderError: (400, "invalid_request_error"),
    RoutingError: (400, "invalid_request_error"),
    ContextOwnershipError: (403, "permission_error"),
    InvalidLaunchHeaderError: (400, "invalid_request_error"),
    UndeclaredDiscontinuityError: (400, "invalid_request_error"),
    # The gateway renders each prompt before admission (gateway/intake/context_window.py): a template that
    # cannot render the messages, or control-token text it interprets, is the request's problem.
    NoChatTemplateError: (500, "server_error"),
    ChatRenderError: (400, "invalid_request_error"),
    ControlTextError: (400, "invalid_request_error"),
    UnsupportedTokenizerError: (500, "server_error"),
    ForeignSessionError: (400, "invalid_request_error"),
    UnspawnedAgentError: (400, "invalid_request_error"),
    HeadPendingError: (409, "conflict_error"),
    ResponsePendingError: (409, "conflict_error"),
    EpisodeClosedError: (409, "conflict_error"),
    MissingRecordError: (409, "conflict_error"),
    ContextConflictError: (409, "conflict_error"),
    DeliveryRefusedError: (409, "conflict_error"),
    UndeliveredHeadsError: (409, "conflict_error"),
    EpisodeNotFoundError: (404, "not_found_error"),
    EpisodeIdReusedError: (409, "conflict_error"),
    NotExternalEpisodeError: (409, "conflict_error"),
    EpisodeFailedError: (409, "conflict_error"),
    EpisodeQueryError: (502, "server_error"),
    TemporalUnavailableError: (503, "server_error"),
    CorruptChatRecordError: (500, "server_error"),
    StorageError: (503, "server_error"),
    TokenizerBusyError: (503, "server_error"),
    LargeBodyBacklogError: (429, "rate_limit_error"),
    BodyWorkerLostError: (503, "server_error"),
    UnrenderableToolCallError: (502, "server_error"),
    TokenCountUnavailableError: (503, "server_error"),
}
# Ledger errors (and the workflow's own) that say "not now / not any more" rather than "wrong request".
CONFLICT_TYPES = frozenset(
    {
        "StaleContinuationError",
        "SettledCallError",
        "DuplicateCallError",
        "DuplicateContextError",
        "PendingPredecessorError",
        "DiscardInUseError",
        "LedgerClosedError",
        "Closing",
        "AlreadyClosed",
        "HandingOver",
        "InvalidTransitionError",
        "AmbiguousAncestryError",
        "ClosingWithOutstandingCallsError",
        "UnresolvedAcknowledgementError",
        "UndeliverableCallError",
    }
)


def _status(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, EpisodeUpdateRejectedError):
        if exc.error_type == "GenerationFailed":
            return 502, "server_error"
        return (409, "conflict_error") if exc.error_type in CONFLICT_TYPES else (400, "invalid_request_error")
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    raise LookupError(type(exc))


def _param(exc: Exception) -> str | None:
    if isinstance(exc, UndeclaredDiscontinuityError) and getattr(exc, "param", None) is None:
        return "tools" if exc.index is None else f"messages[{exc.index}].{exc.field}"
    return getattr(exc, "param", None)


def _code(exc: Exception) -> str:
    if isinstance(exc, EpisodeUpdateRejectedError):
        return exc.error_type
    # A code clients know (OpenAI's `context_length_exceeded`: OpenCode compacts on it) wins.
    return getattr(exc, "openai_code", None) or type(exc).__name__


def refusal_of(exc: Exception) -> Refusal:
    """The refusal a domain exception stands for."""
    status, kind = _status(exc)
    retry_after = getattr(exc, "retry_after", None)
    return Refusal(status, kind, _code(exc), str(exc), _param(exc), retry_after)


def error_response(exc: Exception, shape: ErrorShape = OPENAI_ERRORS) -> JSONResponse:
    """The JSON error answer of a domain exception in a wire format's shape (also sent by a response
    whose delivery was refused)."""
    return shape.response(refusal_of(exc))


def wire_route(shape: ErrorShape) -> type[APIRoute]:
    """The route class of a wire format's routes: refusals on them take `shape`."""
    return type(f"{type(shape).__name__}Route", (APIRoute,), {"error_shape": shape})


def shape_of(request: Request | None) -> ErrorShape:
    """The error shape of the route that matched the request (OpenAI's when none did)."""
    route = request.scope.get("route") if request is not None else None
    return getattr(route, "error_shape", OPENAI_ERRORS)


async def domain_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc, shape_of(request))


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    incident = uuid.uuid4().hex[:12]
    log.error("incident %s: %s %s failed", incident, request.method, request.url.path, exc_info=exc)
    message = f"internal error (incident {incident}); the gateway's log has the details"
    return shape_of(request).response(Refusal(500, "server_error", "InternalError", message))


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    message = f"invalid request: {where}: {first['msg']}"
    return shape_of(request).response(Refusal(400, "invalid_request_error", "InvalidRequest", message, where))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    refusal = Refusal(exc.status_code, kind, f"HTTP{exc.status_code}", message)
    return shape_of(request).response(refusal)


def install_error_handlers(app: FastAPI) -> None:
    for cls in (*STATUS, EpisodeUpdateRejectedError):
        app.add_exception_handler(cls, domain_error)
    # Starlette types a handler's exception as Exception, not the class it is registered for
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected_error)
