"""Reading the history a Responses request's `previous_response_id` names, before it is captured.

The id names one call of the episode (gateway/intake/previous_response.py); its history is that call's
chat record in the object store (capture/records.py): the prompt messages it was sampled on and the
assistant message it returned, as the harness got it. Read from the store, never from this process's
memory, so a relaunched or another gateway resolves the id as well. The request then goes through the
capture pipeline as the whole conversation (gateway/pipeline/capture.py), which decides how it relates to
its context like any other request: nothing here admits, discards or checks the ledger.

Refused before anything is admitted (HTTP 400, `param: previous_response_id`): another episode's id
(`ForeignResponseIdError`), an id of this episode with no record (`UnknownResponseIdError`).
"""

from __future__ import annotations

from gateway.intake.previous_response import (
    PreviousResponse,
    check_episode,
    parse_response_id,
    unknown,
)
from gateway.intake.responses_chat import AcceptedResponses
from gateway.pipeline.capture_state import CaptureState


async def previous_response(state: CaptureState, episode_id: str, response_id: str) -> PreviousResponse:
    """The history `response_id` stands for in `episode_id` (module docstring)."""
    ref = parse_response_id(response_id)
    check_episode(ref, episode_id)
    record = await state.record(episode_id, ref.call_id)
    if record is None:
        raise unknown(ref)
    return PreviousResponse(ref, [*record.messages, record.response])


async def continued(state: CaptureState, episode_id: str, body: AcceptedResponses) -> AcceptedResponses:
    """`body` with the history of its `previous_response_id` read in (`body` itself if it names none)."""
    rid = body.request.previous_response_id
    if rid is None:
        return body
    return body.continuing(await previous_response(state, episode_id, rid))
