"""The OpenAI chat-completions wire format, the gateway's first adapter: its error shape and the
rendering of a captured call (gateway/http/chat_response.py).

Its request (what the wire accepts, and its canonical form) is gateway/intake/chat_request.py; its
route, with the models listing, gateway/http/routes/openai.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from starlette.responses import JSONResponse

from capture.records import ChatRecord
from gateway.http.chat_response import completion_body, sse_events, stream_chunks
from gateway.http.wire.refusal import ErrorShape, Refusal
from gateway.intake.chat_request import ChatCompletionRequest


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class OpenAIErrors:
    """Refusals as the OpenAI clients read them: the body above with the refusal's status; a refused
    stream ends with `data: {"error": {...}}`, which the OpenAI clients raise."""

    def response(self, refusal: Refusal) -> JSONResponse:
        body = error_body(refusal.message, refusal.kind, refusal.code, refusal.param)
        return JSONResponse(body, status_code=refusal.status, headers=refusal.headers)

    def event(self, refusal: Refusal) -> bytes:
        return b"data: " + bytes(self.response(refusal).body) + b"\n\n"


OPENAI_ERRORS = OpenAIErrors()


class ChatCompletionsWire:
    """A captured call as a `chat.completion` object or its `chat.completion.chunk` events."""

    errors: ErrorShape = OPENAI_ERRORS

    def body(self, record: ChatRecord, request: ChatCompletionRequest, model: str) -> dict[str, Any]:
        return completion_body(record, model, int(time.time()))

    def events(self, record: ChatRecord, request: ChatCompletionRequest, model: str) -> Iterable[str]:
        return sse_events(stream_chunks(record, model, int(time.time()), request.include_usage))


CHAT_COMPLETIONS = ChatCompletionsWire()
