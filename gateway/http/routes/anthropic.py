"""The Anthropic Messages routes under `/episodes/{episode_ref}/v1`: `POST /messages` (Claude Code's
`?beta=true` accepted: query parameters change nothing) and `POST /messages/count_tokens`. The
Messages wire adapter (gateway/http/wire/anthropic_messages.py) over the same capture pipeline as chat
completions; every refusal on these routes is in Anthropic's error shape.

Point Claude Code (or any Anthropic client) at `ANTHROPIC_BASE_URL=http://host/episodes/<ref>` with the
episode's token as `ANTHROPIC_API_KEY` (sent as `x-api-key`) or `ANTHROPIC_AUTH_TOKEN` (a bearer token).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.http.deps import CaptureDep, CountTokensBodyDep, EpisodeIdDep, MessagesBodyDep, SettingsDep
from gateway.http.routes.errors import wire_route
from gateway.http.wire.adapter import answer
from gateway.http.wire.anthropic_messages import ANTHROPIC_ERRORS, ANTHROPIC_MESSAGES

router = APIRouter(
    prefix="/episodes/{episode_ref}/v1", tags=["anthropic"], route_class=wire_route(ANTHROPIC_ERRORS)
)


@router.post("/messages")
async def messages(
    episode_id: EpisodeIdDep,
    body: MessagesBodyDep,
    capture: CaptureDep,
    settings: SettingsDep,
    request: Request,
) -> Response:
    delivery = await capture.delivery(episode_id, body.canonical(), request.headers)
    return await answer(ANTHROPIC_MESSAGES, body, body.stream, delivery, capture, settings.model_name)


@router.post("/messages/count_tokens")
async def count_tokens(episode_id: EpisodeIdDep, body: CountTokensBodyDep, capture: CaptureDep) -> dict:
    """The policy's token count of the prompt its chat template renders from these messages and tools."""
    return {"input_tokens": await capture.prompt_tokens(episode_id, body.canonical())}
