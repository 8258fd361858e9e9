"""Response ids, and the history a request continues when it names one (`previous_response_id`).

A response id the gateway returns names exactly one captured call: `resp_` + base64url (no padding) of
`{episode id}\\n{call id}` (`response_id`). It is a pure function of the call (a replayed call answers
with the same id) and needs no index: the gateway reads the call back from its chat record
(capture/records.py, `staging/{episode}/{call}.chat.json`), so a relaunched gateway resolves it too.

A request with `previous_response_id` continues that call: its prompt is the call's full prompt
messages, then the assistant message the call returned (the record's, byte for byte: the generated
tokens are spliced as they were sampled, nothing re-parsed), then the request's own `input`
(`PreviousResponse.messages`; gateway/intake/responses_chat.py builds the rest). The capture then sees
exactly the conversation a client that sends the whole history would have sent, and relates it to its
context as it relates any request (gateway/pipeline/continuation.py): a chain of `previous_response_id`
requests and the same conversation sent whole give the same calls, tokens and rows.

What resolves (gateway/pipeline/previous_response.py): any response of the same episode whose chat
record is there, that is, every call the episode's gateway answered until the episode closes and its
staging is deleted, whatever the request's `store` said (the record is training data, kept either way).
Refused, each naming the id and what to do, before anything is admitted: an id the gateway never made
(`MalformedResponseIdError`), another episode's (`ForeignResponseIdError`), one with no record in this
episode (`UnknownResponseIdError`).

Pure module.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from gateway.intake.capture_request import RequestError

PREFIX = "resp_"
PARAM = "previous_response_id"
_SEPARATOR = "\n"  # in neither episode ids nor call ids


class PreviousResponseError(RequestError):
    """Base of the refusals of a `previous_response_id` (HTTP 400, `param: previous_response_id`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param=PARAM)


class MalformedResponseIdError(PreviousResponseError):
    """A `previous_response_id` that is not an id this gateway returns."""


class ForeignResponseIdError(PreviousResponseError):
    """A `previous_response_id` of another episode's call: a history continues only in its own episode."""


class UnknownResponseIdError(PreviousResponseError):
    """A `previous_response_id` of this episode that names no recorded call."""


@dataclass(frozen=True)
class ResponseRef:
    """The call a response id names."""

    response_id: str
    episode_id: str
    call_id: str


@dataclass(frozen=True)
class PreviousResponse:
    """The history a `previous_response_id` stands for: the call's prompt messages, then its response."""

    ref: ResponseRef
    messages: list[dict[str, Any]]


def response_id(episode_id: str, call_id: str) -> str:
    """The id of call `call_id`'s response (module docstring)."""
    raw = f"{episode_id}{_SEPARATOR}{call_id}".encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_response_id(value: str) -> ResponseRef:
    """The call `value` names; MalformedResponseIdError for anything `response_id` does not make."""
    body = value.removeprefix(PREFIX)
    try:
        if body == value or not body or len(body) % 4 == 1:
            raise ValueError("not a grove response id")
        text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        episode_id, call_id = text.split(_SEPARATOR)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise MalformedResponseIdError(
            f"previous_response_id {value!r} is not a response id this gateway returned (it returns "
            f"'{PREFIX}...' ids in each response's `id`); send the `id` of one of this episode's responses, "
            "or the whole history as `input` without previous_response_id"
        ) from None
    if not episode_id or not call_id or response_id(episode_id, call_id) != value:
        raise MalformedResponseIdError(
            f"previous_response_id {value!r} is not the canonical id of a call; send the `id` of one of this "
            "episode's responses exactly as it was returned, or the whole history as `input`"
        )
    return ResponseRef(value, episode_id, call_id)


def check_episode(ref: ResponseRef, episode_id: str) -> None:
    """ForeignResponseIdError unless `ref` names a call of `episode_id`."""
    if ref.episode_id != episode_id:
        raise ForeignResponseIdError(
            f"previous_response_id {ref.response_id!r} names call {ref.call_id!r} of episode "
            f"{ref.episode_id!r}, not of this request's episode {episode_id!r}: a history continues only "
            "in the episode that answered it; send the whole history as `input` instead"
        )


def unknown(ref: ResponseRef) -> UnknownResponseIdError:
    return UnknownResponseIdError(
        f"previous_response_id {ref.response_id!r} names call {ref.call_id!r} of episode {ref.episode_id!r}, "
        "which has no record of that call (never answered, or the episode's records are gone); send the `id` "
        "of a response this episode returned, or the whole history as `input`"
    )
