"""Settlement: how calls leave the live ledger, at a hand-over (`settle`) and at the end (`close`) (pure).

`close()` resolves every completed call to SELECTED (AUXILIARY by its kind), cancels outstanding calls
only when told to, and returns an accounting record in which every admitted call id appears in exactly
one terminal state (ledger/accounting.py). An outstanding call without that permission is an error
naming whose it is: a worker's (`ClosingWithOutstandingCallsError`) or a receipt that never came
(`UnresolvedAcknowledgementError`). The close is final; closing again returns the same record.

A long episode hands over to its next workflow run with only its *live* calls (`live_calls`): outstanding
calls, calls awaiting delivery, and per context its last `window` calls and its head's last `window`
ancestors, the head included: what a harness may still continue, retry, branch from or discard.
`settle(window)` drops every other call, once the workflow has written it to the episode's ledger pages
(ledger/handover.py), keeping per context what its checks still need (ledger/settled.py); a context
with a call still generating is left whole. `closed_counts` counts the settled calls too, in the states
the close gives them.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from grove.receipts import CallState, ContextOrigin
from ledger.accounting import LedgerAccounting, count_states
from ledger.errors import ClosingWithOutstandingCallsError, UnresolvedAcknowledgementError
from ledger.settled import SettledCalls
from ledger.state import DEAD_STATES, LedgerState


class Settlement(LedgerState):
    """The ledger's close and settle (module docstring)."""

    def _worker_agents(self) -> set[str]:
        return {s.record.agent for s in self.contexts.values() if s.record.origin == ContextOrigin.SPAWN}

    def validate_close(self, *, cancel_outstanding: bool = False) -> None:
        if self.closed or cancel_outstanding:
            return
        outstanding = self.pending()
        if not outstanding:
            return
        contexts = ", ".join(sorted({self.calls[c].context_id for c in outstanding}))
        workers = self._worker_agents()
        if any(self.calls[c].agent in workers for c in outstanding):
            raise self._error(
                ClosingWithOutstandingCallsError,
                contexts,
                outstanding,
                f"closing with {len(outstanding)} outstanding calls, some of worker agents",
                "every admitted call completed, failed or cancelled before close",
                "wait for the workers, or close(cancel_outstanding=True) to cancel and record them",
            )
        raise self._error(
            UnresolvedAcknowledgementError,
            contexts,
            outstanding,
            f"calls {outstanding} were admitted but their receipts never came",
            "a completion or failure receipt for every admitted call",
            "find the lost generate result (retry the activity) or close(cancel_outstanding=True)",
        )

    def close(self, *, cancel_outstanding: bool = False, reason: str = "episode closed") -> LedgerAccounting:
        """Settle every call and return the complete accounting record (idempotent)."""
        self.validate_close(cancel_outstanding=cancel_outstanding)
        if not self.closed:
            for call_id in self.pending():
                self.calls[call_id] = self.calls[call_id].model_copy(
                    update=dict(state=CallState.CANCELLED, note=f"cancelled at close: {reason}")
                )
                self.cancelled_at_close.append(call_id)
            for call_id, receipt in self.calls.items():
                if receipt.state == CallState.COMPLETED:
                    final = CallState.AUXILIARY if receipt.kind.auxiliary else CallState.SELECTED
                    self.calls[call_id] = receipt.model_copy(update=dict(state=final))
            self.closed = True
        return self.accounting().check_complete()

    def live_calls(self, window: int) -> set[str]:
        """Calls something may still change or name: outstanding calls, and per context its last `window`
        calls and its head's last `window` ancestors (the head included): what a harness continues,
        retries (the head's parent), branches from or discards, and responses awaiting delivery. Every
        other call is settled."""
        live = set(self.pending()) | set(self.awaiting_delivery)
        for context_id, ctx in self.contexts.items():
            live.update(ctx.call_ids[-window:])
            call_id = self.head(context_id)
            for _ in range(window):
                if call_id is None or call_id not in self.calls:
                    break
                live.add(call_id)
                call_id = self.calls[call_id].parent_call_id
        return live

    def settle(self, window: int) -> int:
        """Drop every call that is not live (`live_calls`), keeping per context what its checks need
        (ledger/settled.py); returns how many were dropped. The caller has written them first: the
        episode's ledger pages are the only record of a settled call (materialize joins them)."""
        if window < 1:
            raise ValueError(f"branch window {window}: expected at least 1 (the head)")
        live = self.live_calls(window)
        dropped = 0
        for context_id, ctx in self.contexts.items():
            gone = [self.calls[c] for c in ctx.call_ids if c not in live]
            if not gone or any(self.calls[c].state == CallState.ADMITTED for c in ctx.call_ids):
                # With a call in flight the head may fall back past the window when it fails: the
                # workflow settles after draining; a context still generating is left whole.
                continue
            tail = self.settled.setdefault(context_id, SettledCalls())
            tail.absorb(context_id, gone, self._cut(ctx.call_ids, live, tail.cut))
            self.settled_totals.absorb(gone)
            ctx.call_ids = [c for c in ctx.call_ids if c in live]
            for receipt in gone:
                del self.calls[receipt.call_id]
            dropped += len(gone)
        self.branch_window = window
        return dropped

    def _cut(self, call_ids: list[str], live: set[str], old_cut: str | None) -> str | None:
        """The oldest call of `call_ids` that stays live and is newer than every settled call that is
        not dead (those settled before are older than the previous cut)."""
        newest = call_ids.index(old_cut) - 1 if old_cut in call_ids else -1
        for i, call_id in enumerate(call_ids):
            if call_id not in live and self.calls[call_id].state not in DEAD_STATES:
                newest = max(newest, i)
        return next((c for c in call_ids[newest + 1 :] if c in live), None)

    def closed_counts(self) -> dict[CallState, int]:
        """After close: calls per state, settled calls included (the close makes a settled completed call
        SELECTED, or AUXILIARY by its kind, as materialize does on the joined pages)."""
        counts = count_states(self.calls.values())
        for tail in self.settled.values():
            for state, n in tail.closed_counts().items():
                counts[state] += n
        return counts
