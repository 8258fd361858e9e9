"""The OpenAI-compatible routes under `/episodes/{episode_ref}/v1`: chat completions and models; the
Responses API (`/v1/responses`, the Agents SDK's default) answers 404 ResponsesApiNotServedError naming
the fix (`set_default_openai_api("chat_completions")`; gateway/intake/chat_request.py says why).

Point an unmodified OpenAI client at `base_url = http://host/episodes/<ref>/v1` with the episode's
token as api_key, and every request it sends is captured into that episode. A chat response settles its
call when it is done: delivered whole, or discarded (gateway/pipeline/delivery.py).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from capture.records import ChatRecord
from gateway.http.chat_response import completion_body, sse_events, stream_chunks
from gateway.http.delivered_response import DeliveredJSONResponse, DeliveredStreamingResponse
from gateway.http.deps import CaptureDep, ChatBodyDep, EpisodeIdDep, SettingsDep
from gateway.intake.chat_request import ResponsesApiNotServedError, UnknownModelError
from gateway.pipeline.advice import compaction_loop, may_loop, say_once, tool_call_cut
from gateway.pipeline.capture import Capture
from grove.headers import AGENT_HEADER, CALL_ID_HEADER, CONTEXT_HEADER, WARNING_HEADER
from ledger.context_view import ContextView, ViewRequest

router = APIRouter(prefix="/episodes/{episode_ref}/v1", tags=["openai"])


def grove_headers(record: ChatRecord) -> dict[str, str]:
    """Where the call went, so a harness can name it (e.g. x-grove-spawned-by of a worker it starts)."""
    return {
        CALL_ID_HEADER: record.call_id,
        CONTEXT_HEADER: record.context_id,
        AGENT_HEADER: record.agent,
    }


@router.post("/chat/completions")
async def chat_completions(
    episode_id: EpisodeIdDep, body: ChatBodyDep, capture: CaptureDep, settings: SettingsDep, request: Request
):
    delivery = await capture.chat_delivery(episode_id, body, request.headers)
    record = delivery.record
    try:
        headers = grove_headers(record)
        warning = await _advice(capture, episode_id, record)
        if warning is not None:  # a limit too small for the harness (gateway/pipeline/advice.py)
            headers[WARNING_HEADER] = warning
        created = int(time.time())
        if body.stream:
            chunks = stream_chunks(record, settings.model_name, created, body.include_usage)
            return DeliveredStreamingResponse(sse_events(chunks), delivery, headers=headers)
        body_json = completion_body(record, settings.model_name, created)
        return DeliveredJSONResponse(body_json, delivery, headers=headers)
    except BaseException:
        await delivery.settle(False)  # no response will carry it
        raise


async def _advice(capture: Capture, episode_id: str, record: ChatRecord) -> str | None:
    """The warning this call deserves, if any: a tool call cut by max_tokens, a compaction loop."""
    found = say_once(record, "tool_call_cut", tool_call_cut(record))
    if may_loop(record):
        view = await _rewrite_view(capture, episode_id, record)
        found = say_once(record, "compaction_loop", compaction_loop(view, record)) or found
    return found


async def _rewrite_view(capture: Capture, episode_id: str, record: ChatRecord) -> ContextView:
    """The record's context and the context it rewrote: all `compaction_loop` reads, from `context_view`
    queries whose size is the agent's, not the episode's."""
    view = await capture.episodes.context_view(episode_id, ViewRequest(contexts=[record.context_id]))
    ctx = next((c for c in view.contexts if c.context_id == record.context_id), None)
    if ctx is None or ctx.rewrite_of is None:
        return view
    req = ViewRequest(contexts=[record.context_id, ctx.rewrite_of])
    return await capture.episodes.context_view(episode_id, req)


@router.post("/responses")
async def responses(episode_id: EpisodeIdDep) -> None:
    """The Responses API is refused with the fix (see ResponsesApiNotServedError for why); the token
    is checked first and the body is never read."""
    raise ResponsesApiNotServedError(
        f"episode {episode_id!r}: the gateway serves the chat completions API only "
        "(POST .../v1/chat/completions), not the Responses API (POST .../v1/responses): exact token "
        "capture continues chat histories. With the OpenAI Agents SDK call "
        'agents.set_default_openai_api("chat_completions") before running, give each agent an '
        "OpenAIChatCompletionsModel, or run with grove's provider "
        "(harnesses.clients.agents_sdk.GroveModelProvider(...).run_config()), which does both and "
        "names each agent; streamed runs alike",
        param="endpoint",
    )


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "grove"}


@router.get("/models")
async def list_models(episode_id: EpisodeIdDep, settings: SettingsDep) -> dict:
    return {"object": "list", "data": [_model(settings.model_name)]}


@router.get("/models/{model}")
async def get_model(model: str, episode_id: EpisodeIdDep, settings: SettingsDep) -> dict:
    if model != settings.model_name:
        raise UnknownModelError(
            f"model {model!r} is not served here; this gateway serves {settings.model_name!r}"
        )
    return _model(model)
