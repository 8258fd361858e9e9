"""What a wire format provides (`WireAdapter`), and the answer to a captured call in any of them.

A route of a wire format reads its body into its request type (a dependency: gateway/http/deps.py),
hands the canonical form to the pipeline (`Capture.delivery`), and returns `answer(...)`: the call's
record rendered by the adapter as a JSON body or stream events, sent as a delivered response
(gateway/http/delivered_response.py) with grove's headers (which call, context and agent it was) and
the advice the call deserves (gateway/pipeline/advice.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from starlette.responses import Response

from capture.records import ChatRecord
from gateway.http.delivered_response import DeliveredJSONResponse, DeliveredStreamingResponse
from gateway.http.wire.refusal import ErrorShape
from gateway.pipeline.advice import compaction_loop, may_loop, say_once, tool_call_cut
from gateway.pipeline.capture import Capture
from gateway.pipeline.delivery import Delivery
from grove.headers import AGENT_HEADER, CALL_ID_HEADER, CONTEXT_HEADER, WARNING_HEADER
from ledger.context_view import ContextView, ViewRequest

R = TypeVar("R", contravariant=True)  # the wire format's request type


class WireAdapter(Protocol[R]):
    """A wire format: its error shape, and a captured call rendered for its request."""

    errors: ErrorShape

    def body(self, record: ChatRecord, request: R, model: str) -> dict[str, Any]:
        """The JSON body of a non-streamed answer."""
        ...

    def events(self, record: ChatRecord, request: R, model: str) -> Iterable[str]:
        """The server-sent events of a streamed answer, in order; the last one completes it."""
        ...


def grove_headers(record: ChatRecord) -> dict[str, str]:
    """Where the call went, so a harness can name it (e.g. x-grove-spawned-by of a worker it starts)."""
    return {
        CALL_ID_HEADER: record.call_id,
        CONTEXT_HEADER: record.context_id,
        AGENT_HEADER: record.agent,
    }


async def answer(
    wire: WireAdapter[R], request: R, stream: bool, delivery: Delivery, capture: Capture, model: str
) -> Response:
    """The delivered response of a captured call; an answer that cannot be built settles the call
    undelivered."""
    record = delivery.record
    try:
        headers = grove_headers(record)
        warning = await _advice(capture, record)
        if warning is not None:  # a limit too small for the harness (gateway/pipeline/advice.py)
            headers[WARNING_HEADER] = warning
        if stream:
            events = wire.events(record, request, model)
            return DeliveredStreamingResponse(events, delivery, headers=headers, errors=wire.errors)
        body = wire.body(record, request, model)
        return DeliveredJSONResponse(body, delivery, headers=headers, errors=wire.errors)
    except BaseException:
        await delivery.settle(False)  # no response will carry it
        raise


async def _advice(capture: Capture, record: ChatRecord) -> str | None:
    """The warning this call deserves, if any: a tool call cut by max_tokens, a compaction loop."""
    found = say_once(record, "tool_call_cut", tool_call_cut(record))
    if may_loop(record):
        view = await _rewrite_view(capture, record)
        found = say_once(record, "compaction_loop", compaction_loop(view, record)) or found
    return found


async def _rewrite_view(capture: Capture, record: ChatRecord) -> ContextView:
    """The record's context and the context it rewrote: all `compaction_loop` reads, from `context_view`
    queries whose size is the agent's, not the episode's."""
    view = await capture.episodes.context_view(record.episode_id, ViewRequest(contexts=[record.context_id]))
    ctx = next((c for c in view.contexts if c.context_id == record.context_id), None)
    if ctx is None or ctx.rewrite_of is None:
        return view
    req = ViewRequest(contexts=[record.context_id, ctx.rewrite_of])
    return await capture.episodes.context_view(record.episode_id, req)
