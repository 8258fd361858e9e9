"""The OpenAI Responses API under `/episodes/{episode_ref}/v1`: `POST /responses`, the Responses wire
adapter (gateway/http/wire/responses.py) over the capture pipeline. Codex CLI speaks only this API.

Point a Responses client at `base_url = http://host/episodes/<ref>/v1` with the episode's token as the key
(Codex: a model provider with `wire_api = "responses"`, harnesses/codex.py), and every request it sends is
captured into that episode: its input items become the policy's chat messages
(gateway/intake/responses_chat.py), the pipeline continues the agent's context on the exact tokens, and
the answer goes back as a `response` object or the Responses event stream. The history is the client's
(`store: false`: each request carries it whole), or the recorded history of the call its
`previous_response_id` names, read in before capture (gateway/pipeline/previous_response.py); a history
that does not extend the context is refused naming the input item where it differs.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from chat.render import UndeclaredDiscontinuityError
from gateway.http.deps import CaptureDep, EpisodeIdDep, ResponsesBodyDep, SettingsDep
from gateway.http.routes.errors import wire_route
from gateway.http.wire.adapter import answer
from gateway.http.wire.responses import RESPONSES, RESPONSES_ERRORS

router = APIRouter(
    prefix="/episodes/{episode_ref}/v1", tags=["responses"], route_class=wire_route(RESPONSES_ERRORS)
)


@router.post("/responses")
async def responses(
    episode_id: EpisodeIdDep,
    body: ResponsesBodyDep,
    capture: CaptureDep,
    settings: SettingsDep,
    request: Request,
) -> Response:
    try:
        delivery = await capture.delivery(episode_id, body.canonical(), request.headers)
    except UndeclaredDiscontinuityError as err:
        raise body.form.in_input_terms(err) from None
    return await answer(RESPONSES, body, body.stream, delivery, capture, settings.model_name)
