"""FastAPI dependencies of the gateway's routes, as `Annotated` aliases.

The lifespan (gateway/app.py) puts the settings, the Temporal-backed `Episodes` and the `Capture`
service on `app.state`; these read them back. `EpisodeIdDep` decodes the URL's episode reference and
checks the bearer token before anything talks to Temporal.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import Depends, Request

from gateway.auth import check_token
from gateway.capture import Capture
from gateway.chat_request import ChatCompletionRequest, InvalidChatRequestError, parse_chat_request
from gateway.episode_ref import episode_id_of
from gateway.episodes import Episodes
from gateway.settings import GatewaySettings


def get_settings(request: Request) -> GatewaySettings:
    return request.app.state.settings


def get_episodes(request: Request) -> Episodes:
    return request.app.state.episodes


def get_capture(request: Request) -> Capture:
    return request.app.state.capture


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
EpisodesDep = Annotated[Episodes, Depends(get_episodes)]
CaptureDep = Annotated[Capture, Depends(get_capture)]


def authorized_episode(episode_ref: str, request: Request, settings: SettingsDep) -> str:
    """The episode id of the URL, once the request's bearer token is this episode's."""
    episode_id = episode_id_of(episode_ref)
    check_token(settings.secret.get_secret_value(), episode_id, request.headers.get("authorization"))
    return episode_id


EpisodeIdDep = Annotated[str, Depends(authorized_episode)]


async def chat_body(request: Request, settings: SettingsDep) -> ChatCompletionRequest:
    """The request body as a validated chat-completions request (OpenAI-style 4xx otherwise)."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidChatRequestError(f"the request body is not valid JSON: {err}") from None
    return parse_chat_request(body, settings.model_name)


ChatBodyDep = Annotated[ChatCompletionRequest, Depends(chat_body)]
