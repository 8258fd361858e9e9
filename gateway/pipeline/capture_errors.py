"""What capturing a chat request refuses with, beyond the ledger's and the request's own errors: one class
per failure kind; gateway/http/routes/errors.py gives each its HTTP status."""

from __future__ import annotations

from grove.headers import SPAWNED_BY_HEADER


class CaptureError(Exception):
    """Base of the capture errors that are not the ledger's or the request's."""


class EpisodeClosedError(CaptureError):
    """The episode's ledger is closed: the harness closed it, no more calls (HTTP 409)."""


class HeadPendingError(CaptureError):
    """The context's head is still generating: the harness sent the next request too early (HTTP 409)."""


class ResponsePendingError(CaptureError):
    """The context's head has completed and its response is still being delivered by this gateway
    (HTTP 409 with Retry-After): the request came before that response left; retry it shortly."""

    retry_after = 1  # seconds: delivering a finished call takes milliseconds

    def __init__(self, message: str, *, episode_id: str, context_id: str, call_id: str) -> None:
        super().__init__(message)
        self.episode_id, self.context_id, self.call_id = episode_id, context_id, call_id


class ForeignSessionError(CaptureError):
    """An OpenCode root session that is not the session the episode's parent agent runs in (HTTP 400)."""


class MissingRecordError(CaptureError):
    """The chat record of a call the request builds on is missing (HTTP 409)."""


class ContextConflictError(CaptureError):
    """A concurrent request opened the same context id with another reservation (HTTP 409)."""


class DeliveryRefusedError(CaptureError):
    """A completed call whose delivery the ledger refused (the episode was closed first): its response is
    not sent and does not count (HTTP 409)."""


class UndeliveredHeadsError(CaptureError):
    """Too many undelivered heads of one context in a row (HTTP 409)."""


class UnspawnedAgentError(CaptureError):
    """A new agent without a spawner in an episode whose spec refuses them (HTTP 400)."""

    param = SPAWNED_BY_HEADER


class TokenCountUnavailableError(CaptureError):
    """A token count asked of a gateway without the policy's tokenizer (HTTP 503)."""
