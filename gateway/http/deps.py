"""FastAPI dependencies of the gateway's routes, as `Annotated` aliases.

The lifespan (gateway/http/app.py) puts the settings, the Temporal-backed `Episodes` and the `Capture`
service on `app.state`; these read them back. `EpisodeIdDep` decodes the URL's episode reference and
checks the bearer token before anything talks to Temporal.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from pydantic import ValidationError

from gateway.http.auth import check_token
from gateway.http.episode_ref import episode_id_of
from gateway.http.settings import GatewaySettings
from gateway.intake.body_parse import BodyCheck, BodyParser, check_chat_body, check_responses_body
from gateway.intake.capture_request import WireRequest
from gateway.intake.chat_request import ChatCompletionRequest
from gateway.intake.context_window import ContextLengthExceededError
from gateway.intake.large_bodies import BodyAdmission
from gateway.intake.limits import InvalidBodyError, declared_size, parse_json, read_body
from gateway.intake.messages_request import MessagesRequest, check_count_tokens_body, check_messages_body
from gateway.intake.responses_chat import AcceptedResponses
from gateway.pipeline.capture import Capture
from gateway.pipeline.identity import check_headers
from gateway.pipeline.launch_records import launch_of
from gateway.pipeline.previous_response import continued
from gateway.temporal.episode_client import Episodes
from grove.contracts import CloseRequest


def get_settings(request: Request) -> GatewaySettings:
    return request.app.state.settings


def get_episodes(request: Request) -> Episodes:
    return request.app.state.episodes


def get_capture(request: Request) -> Capture:
    return request.app.state.capture


API_KEY_HEADER = "x-api-key"

SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
EpisodesDep = Annotated[Episodes, Depends(get_episodes)]
CaptureDep = Annotated[Capture, Depends(get_capture)]


def authorized_episode(episode_ref: str, request: Request, settings: SettingsDep) -> str:
    """The episode id of the URL, once the request's bearer token (or `x-api-key`) is this episode's."""
    episode_id = episode_id_of(episode_ref)
    authorization = request.headers.get("authorization")
    api_key = request.headers.get(API_KEY_HEADER)
    if authorization is None and api_key is not None:  # Anthropic's clients send the key as x-api-key
        authorization = f"Bearer {api_key}"
    check_token(settings.secret.get_secret_value(), episode_id, authorization)
    return episode_id


EpisodeIdDep = Annotated[str, Depends(authorized_episode)]


async def admitted_body(
    request: Request, settings: GatewaySettings, episode_id: str, check: BodyCheck
) -> WireRequest:
    """The request body as a wire format's validated request (`check`: its 4xx otherwise); read only after
    the token was checked, and only up to the body cap (gateway/intake/limits.py). A small body is read and
    checked here; a large one waits its episode's turn unread (gateway/intake/large_bodies.py) and is
    checked in a worker process (gateway/intake/body_parse.py)."""
    check_headers(request.headers)
    limits = settings.limits
    admission: BodyAdmission = request.app.state.body_admission
    size = declared_size(request, limits.max_body_bytes, "max_body_bytes")
    if not admission.is_large(size):
        raw = await read_body(request, limits.max_body_bytes, "max_body_bytes", limits)
        return check(raw, limits, settings.model_name, settings.max_model_len)
    async with admission.turn(episode_id, limits.max_body_bytes if size is None else size):
        raw = await read_body(request, limits.max_body_bytes, "max_body_bytes", limits)
        parser: BodyParser = request.app.state.body_parser
        checked = await parser.parse(
            episode_id, raw, limits, settings.model_name, settings.max_model_len, check
        )
    if isinstance(checked, ContextLengthExceededError):  # the prompt's lower bound refused it
        launch_of(request.headers)  # whose refusal comes first in gateway/pipeline/capture.py
        raise checked
    return checked


async def chat_body(
    request: Request, settings: SettingsDep, episode_id: EpisodeIdDep
) -> ChatCompletionRequest:
    """The body as a validated chat-completions request (OpenAI-style 4xx otherwise)."""
    body = await admitted_body(request, settings, episode_id, check_chat_body)
    assert isinstance(body, ChatCompletionRequest)  # what check_chat_body returns
    return body


async def messages_body(request: Request, settings: SettingsDep, episode_id: EpisodeIdDep) -> MessagesRequest:
    """The body as a validated Anthropic Messages request (Anthropic-style 4xx otherwise)."""
    body = await admitted_body(request, settings, episode_id, check_messages_body)
    assert isinstance(body, MessagesRequest)  # what check_messages_body returns
    return body


async def count_tokens_body(
    request: Request, settings: SettingsDep, episode_id: EpisodeIdDep
) -> MessagesRequest:
    """The body of a count_tokens request (a Messages body without max_tokens)."""
    body = await admitted_body(request, settings, episode_id, check_count_tokens_body)
    assert isinstance(body, MessagesRequest)
    return body


async def responses_body(
    request: Request, settings: SettingsDep, episode_id: EpisodeIdDep
) -> AcceptedResponses:
    """The body as a validated Responses request and its chat form, the history its
    `previous_response_id` names in front (4xx in the Responses shape otherwise)."""
    body = await admitted_body(request, settings, episode_id, check_responses_body)
    assert isinstance(body, AcceptedResponses)  # what check_responses_body returns
    # a previous_response_id's history, read from the store before capture (400 if it names none)
    return await continued(get_capture(request), episode_id, body)


async def close_body(request: Request, settings: SettingsDep, _: EpisodeIdDep) -> CloseRequest:
    """The close request (an empty body is the default close); read after auth, capped."""
    raw = await read_body(request, settings.limits.max_close_bytes, "max_close_bytes", settings.limits)
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
MessagesBodyDep = Annotated[MessagesRequest, Depends(messages_body)]
CountTokensBodyDep = Annotated[MessagesRequest, Depends(count_tokens_body)]
ResponsesBodyDep = Annotated[AcceptedResponses, Depends(responses_body)]
CloseBodyDep = Annotated[CloseRequest, Depends(close_body)]
