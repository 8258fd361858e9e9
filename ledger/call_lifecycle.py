"""A call's lifecycle after admission: its completion and the state it ends in (pure).

Calls move admitted -> completed -> exactly one terminal state, or straight from admitted to a dead state:

- `complete`: the generation receipt (staging key, digests, policy version, sampling). A continuation's
  prompt is at least its parent's prompt + completion, else an undeclared discontinuity;
- `fail`: the generation failed (the call has no tokens); `cancel`: abandoned before it completed;
  `abandon`: a lost generation attempt (worker crash, timeout), accounted DISCARDED, never trained, and
  retried under a new call id (docs/design.md section 8);
- `discard`: a completed response the harness did not use (a retry, a resample), never trained. Refused
  while live calls extend it or a context names it as its spawner, and when it would leave a settled call
  as its context's head.

SELECTED and AUXILIARY are the close's (ledger/settlement.py). Repeating a transition that already
happened with the same data is a no-op, so retried Updates are harmless; any other change to a call is an
`InvalidTransitionError` naming the order of events to check. A dead call awaits no delivery. Each
`validate_*` raises what its transition would raise, without changing anything (the Update validators).

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from grove.receipts import CallReceipt, CallState, TokenDigests, ToolCallOutcome
from grove.sampling import SamplingProcessing
from ledger.errors import (
    DiscardInUseError,
    InvalidTransitionError,
    SettledCallError,
    UndeclaredDiscontinuityError,
)
from ledger.state import DEAD_STATES, LedgerState


class CallLifecycle(LedgerState):
    """The ledger's call transitions after admission (module docstring)."""

    def _expect_state(self, receipt: CallReceipt, allowed: CallState, target: CallState) -> bool:
        """True when the transition must happen; False when it already happened (idempotent repeat)."""
        if receipt.state == allowed:
            return True
        if receipt.state == target:
            return False
        raise self._error(
            InvalidTransitionError,
            receipt.context_id,
            [receipt.call_id],
            f"call {receipt.call_id!r} is {receipt.state.value}, cannot become {target.value}",
            f"a call in state {allowed.value}",
            "check the order of events the harness/gateway sent; each call ends exactly once",
        )

    def validate_complete(
        self,
        call_id: str,
        staging_key: str,
        digests: TokenDigests,
        policy_version: int,
        finish_reason: str | None = None,
        sampling: SamplingProcessing | None = None,
    ) -> bool:
        """Raise complete's error without mutating; returns False when complete would be a no-op."""
        receipt = self.call(call_id)
        done = receipt.model_copy(
            update=dict(
                state=CallState.COMPLETED,
                staging_key=staging_key,
                digests=digests,
                policy_version=policy_version,
                finish_reason=finish_reason,
                sampling=sampling,
            )
        )
        if receipt.state == CallState.COMPLETED and receipt != done:
            raise self._error(
                InvalidTransitionError,
                receipt.context_id,
                [call_id],
                f"call {call_id!r} was already completed with a different receipt",
                f"the same receipt as before ({receipt.staging_key}, {receipt.digests})",
                "complete each call once; a regenerated response needs a new call id",
            )
        if not self._expect_state(receipt, CallState.ADMITTED, CallState.COMPLETED):
            return False
        self._check_length(receipt, digests)
        return True

    def _check_length(self, receipt: CallReceipt, digests: TokenDigests) -> None:
        if receipt.parent_call_id is None:
            return
        parent = self.calls[receipt.parent_call_id].digests
        assert parent is not None  # admit() only lets a call extend a completed call
        need = parent.prompt_len + parent.completion_len
        if digests.prompt_len < need:
            raise self._error(
                UndeclaredDiscontinuityError,
                receipt.context_id,
                [receipt.call_id, receipt.parent_call_id],
                f"prompt of {receipt.call_id!r} has {digests.prompt_len} tokens, shorter than "
                f"{receipt.parent_call_id!r}'s prompt + completion ({need})",
                "a prompt that starts with the parent's prompt + completion",
                "fail this call; if the history was rewritten, open a REWRITE context and admit there",
            )

    def complete(
        self,
        call_id: str,
        staging_key: str,
        digests: TokenDigests,
        policy_version: int,
        finish_reason: str | None = None,
        sampling: SamplingProcessing | None = None,
        tool_call: ToolCallOutcome | None = None,
    ) -> CallReceipt:
        """Record the generation receipt of an admitted call (state COMPLETED).

        `sampling` is what the generate activity sampled with (its GenerateResult.sampling); the
        reconstruction refuses a trained call completed without it. `tool_call` is how the completion
        parsed when tools were offered (GenerateResult.tool_call), counted by the step metrics.
        """
        if self.validate_complete(call_id, staging_key, digests, policy_version, finish_reason, sampling):
            self.calls[call_id] = self.calls[call_id].model_copy(
                update=dict(
                    state=CallState.COMPLETED,
                    staging_key=staging_key,
                    digests=digests,
                    policy_version=policy_version,
                    finish_reason=finish_reason,
                    sampling=sampling,
                    tool_call=tool_call,
                )
            )
        return self.calls[call_id]

    def _end(self, call_id: str, allowed: CallState, target: CallState, reason: str) -> CallReceipt:
        receipt = self.call(call_id)
        if self._expect_state(receipt, allowed, target):
            self.calls[call_id] = receipt.model_copy(update=dict(state=target, note=reason))
            self._used(call_id)  # a dead call awaits nothing
        return self.calls[call_id]

    def fail(self, call_id: str, reason: str) -> CallReceipt:
        """An admitted call whose generation failed (it has no tokens)."""
        return self._end(call_id, CallState.ADMITTED, CallState.FAILED, reason)

    def abandon(self, call_id: str, reason: str) -> CallReceipt:
        """An admitted call whose generation attempt was lost (worker crash, timeout): accounted as
        DISCARDED, never trained; the retry is a new admission with a new call id."""
        return self._end(call_id, CallState.ADMITTED, CallState.DISCARDED, reason)

    def cancel(self, call_id: str, reason: str) -> CallReceipt:
        """An admitted call that was abandoned before it completed."""
        return self._end(call_id, CallState.ADMITTED, CallState.CANCELLED, reason)

    def validate_discard(self, call_id: str) -> None:
        if call_id not in self.calls and self.state_of(call_id) == CallState.DISCARDED:
            return  # a repeat of a discard whose call has been settled since
        receipt = self.call(call_id)
        if receipt.state == CallState.DISCARDED:
            return
        self._expect_state(receipt, CallState.COMPLETED, CallState.DISCARDED)
        users = [
            c for c, r in self.calls.items() if r.parent_call_id == call_id and r.state not in DEAD_STATES
        ]
        spawned = [c for c, s in self.contexts.items() if s.record.spawned_by_call == call_id]
        if users or spawned:
            raise self._error(
                DiscardInUseError,
                receipt.context_id,
                [call_id, *users],
                f"call {call_id!r} is extended by live calls {users} and spawned contexts {spawned}",
                "discard only responses nothing builds on",
                "discard (or fail/cancel) the calls that extend it first; a response that spawned a "
                "worker was used",
            )
        self._check_head_stays_live(receipt)

    def _check_head_stays_live(self, receipt: CallReceipt) -> None:
        """Discarding a context's head makes its newest other call that is not dead the head. When that is
        a settled call (it is newer than the newest live candidate), the ledger cannot know the head
        any more: refused (ledger/settled.py `cut`)."""
        cid, call_id = receipt.context_id, receipt.call_id
        tail = self.settled.get(cid)
        if tail is None or not tail.non_dead() or call_id != self.head(cid):
            return
        ids = self.contexts[cid].call_ids
        rest = [c for c in ids if c != call_id and self.calls[c].state not in DEAD_STATES]
        if rest and tail.cut in ids and ids.index(rest[-1]) >= ids.index(tail.cut):
            return
        raise self._error(
            SettledCallError,
            cid,
            [call_id],
            f"discarding {call_id!r}, the head of context {cid!r}, would make a settled call (older than the "
            f"branch window, branch_window={self.branch_window}) the context's head",
            f"a discard that leaves a call of the window {ids} as the head",
            f"keep {call_id!r} and continue from it, or open a REWRITE context; a harness that goes back "
            "further needs an episode started with a larger EpisodeSpec.branch_window",
        )

    def discard(self, call_id: str, reason: str) -> CallReceipt:
        """A completed call whose response the harness did not use (retry, resample): never trained."""
        self.validate_discard(call_id)
        if call_id not in self.calls:  # settled, already discarded (validate_discard let only that pass)
            owner = self.settled_context(call_id)
            assert owner is not None
            agent = self.contexts[owner].record.agent
            return CallReceipt(call_id=call_id, context_id=owner, agent=agent, state=CallState.DISCARDED)
        return self._end(call_id, CallState.COMPLETED, CallState.DISCARDED, reason)
