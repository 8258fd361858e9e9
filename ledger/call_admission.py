"""Admitting a call: where in its context a new model call may start (pure).

Within a context:

- the first call is the context's root (`extends=None`; also a retry of a root that failed, was
  cancelled or discarded);
- a later call extends the context's *head*, or names an older completed call with `branch=True` (a
  fork, a kept retry);
- `extends=None` in a context that already has calls is an undeclared discontinuity: a rewrite must open
  a REWRITE context (ledger/context_opening.py);
- a call can only extend a *completed* call of its own context (its tokens must exist), never a dead or a
  settled one;
- every call id, retries included, is admitted once; a retired context and a closed ledger admit nothing.

A call admitted `awaits_delivery` counts only once its response reached its harness
(ledger/delivery.py); extending a call marks its response as used. `validate_admit` raises what
`admit` would raise, without changing anything (the `call` Update's validator).

Ancestry by tokens: `ancestry_ranges` names the prompt slices to hash (ledger/ancestry.py), and
`resolve_extends` picks the completed call whose prompt + completion is the longest prefix of the new
prompt; two equal candidates fail closed (`AmbiguousAncestryError`).

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from pydantic import BaseModel

from grove.receipts import CallKind, CallReceipt, CallState
from ledger.ancestry import AncestryEvidence, candidate_ranges, match_candidates
from ledger.errors import (
    AmbiguousAncestryError,
    CrossContextContinuationError,
    DuplicateCallError,
    MissingAncestryEvidenceError,
    PendingPredecessorError,
    StaleContinuationError,
    UndeclaredDiscontinuityError,
)
from ledger.state import DEAD_STATES, LIVE_COMPLETED_STATES, ContextState, LedgerState


class AdmitRequest(BaseModel):
    """Payload of the admission Update: one call about to be generated."""

    call_id: str
    context_id: str
    kind: CallKind = CallKind.ACTION
    extends: str | None = None  # the call whose prompt + completion this call's prompt starts with
    branch: bool = False  # True: `extends` may be an older call than the head (fork / kept retry)


class CallAdmission(LedgerState):
    """The ledger's admission of calls (module docstring)."""

    def validate_admit(
        self,
        call_id: str,
        context_id: str,
        *,
        kind: CallKind = CallKind.ACTION,
        extends: str | None = None,
        branch: bool = False,
    ) -> None:
        """Raise the error admit would raise, without changing anything."""
        ids = [call_id] + ([extends] if extends else [])
        self._check_open_ledger(context_id, ids)
        settled_in = self.settled_context(call_id)
        if call_id in self.calls or settled_in is not None:
            into = self.calls[call_id].context_id if settled_in is None else settled_in
            since = "" if settled_in is None else ", and settled since"
            raise self._error(
                DuplicateCallError,
                context_id,
                [call_id],
                f"call {call_id!r} was already admitted (into context {into!r}{since})",
                "a fresh call id per model call",
                "give every model call (retries included) its own id",
            )
        ctx = self.context(context_id, call_ids=ids)
        if ctx.retired_by is not None:
            raise self._error(
                StaleContinuationError,
                context_id,
                ids,
                f"context {context_id!r} was retired by rewrite {ctx.retired_by!r}",
                f"calls of agent {ctx.record.agent!r} in its current context",
                f"admit into context {self._current_context(ctx.record.agent)!r}",
            )
        if extends is None:
            self._check_root_call(ctx, call_id, branch)
        else:
            self._check_extension(ctx, call_id, extends, branch)

    def _check_root_call(self, ctx: ContextState, call_id: str, branch: bool) -> None:
        # A root is the context's first live call: the very first, or a retry of a first call that
        # failed, was cancelled or was discarded. Anything else is a discontinuity in disguise.
        cid = ctx.record.context_id
        head = self.head(cid)
        if head is not None or branch:
            raise self._error(
                UndeclaredDiscontinuityError,
                cid,
                [call_id],
                f"call {call_id!r} extends nothing in context {cid!r}, whose head is {head!r}",
                "extends=<the head> (or an older call with branch=True); only a context's first live "
                "call extends nothing",
                "if the history was rewritten (compaction), open a REWRITE context and admit there",
            )

    def _check_extension(self, ctx: ContextState, call_id: str, extends: str, branch: bool) -> None:
        cid = ctx.record.context_id
        ids = [call_id, extends]
        parent = self.call(extends, context_id=cid)
        if parent.context_id != cid:
            raise self._error(
                CrossContextContinuationError,
                cid,
                ids,
                f"call {call_id!r} extends {extends!r} of context {parent.context_id!r}",
                f"a call of context {cid!r}",
                "a new context starts with a root call (extends=None); link workers by spawned_by_call",
            )
        if parent.state == CallState.ADMITTED:
            raise self._error(
                PendingPredecessorError,
                cid,
                ids,
                f"call {extends!r} has not completed",
                "a completed predecessor (its tokens must exist)",
                f"wait for {extends!r} to complete before admitting {call_id!r}",
            )
        if parent.state in DEAD_STATES:
            raise self._error(
                StaleContinuationError,
                cid,
                ids,
                f"call {extends!r} is {parent.state.value}",
                "a predecessor that is not discarded, failed or cancelled",
                f"extend the head {self.head(cid)!r}, or branch from a live call",
            )
        head = self.head(cid)
        if extends != head and not branch:
            raise self._error(
                StaleContinuationError,
                cid,
                ids,
                f"call {extends!r} is no longer the head of context {cid!r} (the head is {head!r})",
                f"extends={head!r}, or branch=True for a fork",
                f"extend {head!r}; if {head!r} was a retry the harness dropped, discard it first",
            )

    def admit(
        self,
        call_id: str,
        context_id: str,
        *,
        kind: CallKind = CallKind.ACTION,
        extends: str | None = None,
        branch: bool = False,
        awaits_delivery: bool = False,
    ) -> CallReceipt:
        """Admit a call about to be generated; returns its receipt (state ADMITTED). `awaits_delivery`: its
        response counts only once delivered (ledger/delivery.py); else delivered on completion."""
        self.validate_admit(call_id, context_id, kind=kind, extends=extends, branch=branch)
        ctx = self.contexts[context_id]
        receipt = CallReceipt(
            call_id=call_id, context_id=context_id, agent=ctx.record.agent, kind=kind, parent_call_id=extends
        )
        self.calls[call_id] = receipt
        ctx.call_ids.append(call_id)
        self._used(extends)  # a response the harness continues reached it
        if awaits_delivery:
            self.awaiting_delivery.append(call_id)
        return receipt

    def admit_request(self, request: AdmitRequest) -> CallReceipt:
        return self.admit(**request.model_dump())

    def validate_admit_request(self, request: AdmitRequest) -> None:
        self.validate_admit(**request.model_dump())

    # ------------------------------------------------------------------------------------ ancestry

    def ancestry_ranges(self, context_id: str) -> list[tuple[int, int]]:
        """Prompt slices the gateway must hash (ancestry_evidence) so resolve_extends can decide."""
        return candidate_ranges(self._candidates(context_id))

    def _candidates(self, context_id: str) -> list[CallReceipt]:
        return [
            self.calls[c]
            for c in self.context(context_id).call_ids
            if self.calls[c].state in LIVE_COMPLETED_STATES
        ]

    def resolve_extends(self, context_id: str, evidence: AncestryEvidence) -> str | None:
        """The completed call of `context_id` whose prompt + completion is the longest prefix of the
        evidenced prompt; None when none matches (a root or a rewrite). Two equal candidates -> error."""
        match = match_candidates(self._candidates(context_id), evidence)
        if match.missing:
            raise self._error(
                MissingAncestryEvidenceError,
                context_id,
                [],
                f"evidence lacks digests of prompt slices {match.missing}",
                "a digest for every range of ancestry_ranges() that fits in the prompt",
                "hash exactly the ranges ancestry_ranges(context_id) returns, with ancestry_evidence()",
            )
        if len(match.longest) > 1:
            raise self._error(
                AmbiguousAncestryError,
                context_id,
                match.longest,
                f"calls {match.longest} all match the first {match.length} tokens of the new prompt",
                "exactly one candidate parent with the longest matching prefix",
                "name the parent explicitly (extends=...), or discard the duplicate retry first",
            )
        return match.longest[0] if match.longest else None
