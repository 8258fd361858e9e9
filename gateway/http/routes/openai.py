"""The OpenAI-compatible routes under `/episodes/{episode_ref}/v1`: chat completions (the chat-completions
wire adapter, gateway/http/wire/chat_completions.py, over the capture pipeline) and models. The Responses
API (`/v1/responses`) is its own wire format: gateway/http/routes/responses.py.

Point an unmodified OpenAI client at `base_url = http://host/episodes/<ref>/v1` with the episode's
token as api_key, and every request it sends is captured into that episode. A chat response settles its
call when it is done: delivered whole, or discarded (gateway/pipeline/delivery.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.http.deps import CaptureDep, ChatBodyDep, EpisodeIdDep, SettingsDep
from gateway.http.routes.errors import wire_route
from gateway.http.wire.adapter import answer
from gateway.http.wire.chat_completions import CHAT_COMPLETIONS, OPENAI_ERRORS
from gateway.intake.chat_request import UnknownModelError

router = APIRouter(
    prefix="/episodes/{episode_ref}/v1", tags=["openai"], route_class=wire_route(OPENAI_ERRORS)
)


@router.post("/chat/completions")
async def chat_completions(
    episode_id: EpisodeIdDep, body: ChatBodyDep, capture: CaptureDep, settings: SettingsDep, request: Request
) -> Response:
    delivery = await capture.delivery(episode_id, body.canonical(), request.headers)
    return await answer(CHAT_COMPLETIONS, body, body.stream, delivery, capture, settings.model_name)


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
