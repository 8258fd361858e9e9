"""FastAPI dependencies of the gateway's routes, as `Annotated` aliases.

The lifespan (gateway/app.py) puts the settings, the Temporal-backed `Episodes` and the `Capture`
service on `app.state`; these read them back. `EpisodeIdDep` decodes the URL's episode reference and
checks the bearer token before anything talks to Temporal.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from pydantic import ValidationError

from gateway.auth import check_token
from gateway.capture import Capture
from gateway.chat_request import ChatCompletionRequest, parse_chat_request
from gateway.context_window import check_max_tokens
from gateway.episode_ref import episode_id_of
from gateway.episodes import Episodes
from gateway.identity import check_headers
from gateway.limits import InvalidBodyError, check_counts, parse_json, read_body
from gateway.settings import GatewaySettings
from grove.contracts import CloseRequest


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


async def chat_body(request: Request, settings: SettingsDep, _: EpisodeIdDep) -> ChatCompletionRequest:
    """The request body as a validated chat-completions request (OpenAI-style 4xx otherwise); read
    only after the token was checked, and only up to the body cap (gateway/limits.py)."""
    check_headers(request.headers)
    limits = settings.limits
    body = parse_json(await read_body(request, limits.max_body_bytes, "max_body_bytes"), limits)
    if isinstance(body, dict):
        check_counts(body, limits)
    chat = parse_chat_request(body, settings.model_name)
    check_max_tokens(chat, settings.max_model_len)
    return chat


async def close_body(request: Request, settings: SettingsDep, _: EpisodeIdDep) -> CloseRequest:
    """The close request (an empty body is the default close); read after auth, capped."""
    raw = await read_body(request, settings.limits.max_close_bytes, "max_close_bytes")
    if not raw.strip():
        return CloseRequest()
    body = parse_json(raw, settings.limits)
    try:
        return CloseRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidBodyError(f"invalid close request: {where}: {first['msg']}", param=where) from None


ChatBodyDep = Annotated[ChatCompletionRequest, Depends(chat_body)]
CloseBodyDep = Annotated[CloseRequest, Depends(close_body)]
