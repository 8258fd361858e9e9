"""The ledger's typed errors: one class per rule a call or a context can break (pure).

Every rule violation of the episode ledger (ledger/ledger.py) raises a `LedgerError` subclass that
carries the episode id, the context id, the call ids involved, what was expected and what to do. The
workflow turns one into a non-retryable ApplicationError of the same type name (workflows/episode.py), so
the refused Update, and the gateway's answer to it (gateway/http/routes/errors.py), name the rule.

Pure module: stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable


class LedgerError(ValueError):
    """A ledger rule was broken. Carries the ids involved, what was expected and what to do."""

    def __init__(
        self,
        *,
        episode_id: str,
        context_id: str | None,
        call_ids: Iterable[str],
        problem: str,
        expected: str,
        action: str,
    ) -> None:
        self.episode_id = episode_id
        self.context_id = context_id
        self.call_ids = list(call_ids)
        self.expected = expected
        self.action = action
        super().__init__(
            f"{problem} [episode {episode_id}, context {context_id}, calls {self.call_ids}]; "
            f"expected: {expected}; to fix: {action}"
        )


class AmbiguousAncestryError(LedgerError):
    """Two different completed calls match the same longest prefix of a new prompt."""


class StaleContinuationError(LedgerError):
    """A call extends something that is no longer a head: an older call, a dead call, a retired context."""


class UndeclaredDiscontinuityError(LedgerError):
    """A call that does not extend its context's line (or cannot, by length) without a declared rewrite."""


class UnresolvedAcknowledgementError(LedgerError):
    """At close, a call was admitted but its receipt (completion or failure) never came."""


class ClosingWithOutstandingCallsError(LedgerError):
    """Close while worker calls are still outstanding, without asking to cancel them."""


class DuplicateCallError(LedgerError):
    """A call id admitted twice."""


class DuplicateContextError(LedgerError):
    """A context id opened twice."""


class UnknownContextError(LedgerError):
    """A call or rewrite names a context the ledger never opened."""


class UnknownCallError(LedgerError):
    """An operation names a call id the ledger never admitted."""


class InvalidReservationError(LedgerError):
    """A context reservation that breaks the origin rules (ROOT, SPAWN, REWRITE)."""


class CrossContextContinuationError(LedgerError):
    """A call claims to extend a call of another context (contexts are independent token streams)."""


class PendingPredecessorError(LedgerError):
    """A call extends a call that has not completed yet: its tokens do not exist."""


class InvalidTransitionError(LedgerError):
    """A state change that the call's lifecycle does not allow (e.g. completing a failed call)."""


class DiscardInUseError(LedgerError):
    """Discarding a call that live calls extend or that spawned a context: they would lose their origin."""


class LedgerClosedError(LedgerError):
    """A change to a ledger that is already closed."""


class MissingAncestryEvidenceError(LedgerError):
    """Ancestry evidence lacks the digest of a slice that a candidate parent needs."""


class SettledCallError(LedgerError):
    """An operation names a call the ledger has settled: older than its context's branch window, written
    in the episode's ledger pages and no longer in the workflow (extend, branch, discard, spawn)."""
