"""The OpenAI Responses wire format (Codex CLI's only one): its error shape and the rendering of a captured
call (gateway/http/responses_response.py).

Its request (what the wire accepts, its chat form and canonical form) is gateway/intake/responses_request.py
and gateway/intake/responses_chat.py; its route gateway/http/routes/responses.py.

Refusals: an HTTP error has OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`, as
the Responses API answers a bad request); a stream whose last event was refused ends with
`response.failed`, the Responses API's own terminal failure event, carrying `error: {code, message}`
(a Responses client stops there, as at any failed response).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from starlette.responses import JSONResponse

from capture.records import ChatRecord
from gateway.http.responses_response import ResponseShape, response_body, sse_events, stream_events
from gateway.http.wire.chat_completions import OPENAI_ERRORS
from gateway.http.wire.refusal import ErrorShape, Refusal
from gateway.intake.responses_chat import AcceptedResponses


class ResponsesErrors:
    """Refusals as a Responses client reads them (module docstring)."""

    def response(self, refusal: Refusal) -> JSONResponse:
        return OPENAI_ERRORS.response(refusal)

    def event(self, refusal: Refusal) -> bytes:
        failed = {
            "type": "response.failed",
            "response": {
                "object": "response",
                "status": "failed",
                "error": {"code": refusal.code, "message": refusal.message},
                "output": [],
            },
        }
        return f"event: response.failed\ndata: {json.dumps(failed, ensure_ascii=False)}\n\n".encode()


RESPONSES_ERRORS = ResponsesErrors()


class ResponsesWire:
    """A captured call as a `response` object or the Responses event sequence; tool calls are written
    back by the request's own tool routes (namespaces, custom tools)."""

    errors: ErrorShape = RESPONSES_ERRORS

    def _shape(self, request: AcceptedResponses, model: str) -> ResponseShape:
        return ResponseShape(model=model, created_at=int(time.time()), routes=request.form.routes)

    def body(self, record: ChatRecord, request: AcceptedResponses, model: str) -> dict[str, Any]:
        return response_body(record, self._shape(request, model))

    def events(self, record: ChatRecord, request: AcceptedResponses, model: str) -> Iterable[str]:
        return sse_events(stream_events(record, self._shape(request, model)))


RESPONSES = ResponsesWire()
