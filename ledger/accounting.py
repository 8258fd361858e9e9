"""Per-call accounting of an episode's ledger: how many calls are in which state, and the closing record.

The ledger answers Temporal queries with a `LedgerSummary` while the episode runs
(ledger/report.py), and returns a `LedgerAccounting` from `close()` (ledger/settlement.py):
every admitted call id appears in exactly one terminal state, and `check_complete` proves it (admitted =
selected + discarded + auxiliary + cancelled + failed; docs/design.md section 2).

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from grove.receipts import TERMINAL_STATES, CallReceipt, CallState, ContextOrigin


class IncompleteAccountingError(ValueError):
    """A closing record where some admitted call is in no terminal state, or in more than one."""


def count_states(receipts: Iterable[CallReceipt]) -> dict[CallState, int]:
    """Number of calls per state, every state present (zeros included) in CallState order."""
    counts = dict.fromkeys(CallState, 0)
    for receipt in receipts:
        counts[receipt.state] += 1
    return counts


class ContextSummary(BaseModel):
    """One context as a Temporal query shows it, with its origin links (where it came from and what
    replaced it), so the tree of agents is readable without the workflow history."""

    context_id: str
    agent: str
    origin: ContextOrigin
    spawned_by_call: str | None = None  # SPAWN: the call (of another agent) whose response spawned it
    rewrite_of: str | None = None  # REWRITE: the context it replaced
    retired_by: str | None  # the REWRITE context that replaced this one, if any
    head: str | None  # the call a plain continuation must extend now
    counts: dict[CallState, int]
    pending: list[str]  # admitted, not yet completed (admission order)
    awaiting_delivery: list[str] = Field(default_factory=list)  # completed, response not yet delivered


SUMMARY_PAGE_CONTEXTS = 500  # ~300 KB of contexts per answer, far below Temporal's 2 MB payload limit
MAX_WARNINGS = 20  # warnings listed in one answer; more are counted in a last line


class SummaryPage(BaseModel):
    """Which contexts one `summary` query answer holds: `limit` of them from `offset` (opening order).
    The answer's size is bounded by the page, whatever the episode's: a reader pages with
    `next_offset` until it is None."""

    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=SUMMARY_PAGE_CONTEXTS, ge=1, le=SUMMARY_PAGE_CONTEXTS)


class LedgerSummary(BaseModel):
    """Small, query-friendly picture of the ledger: counts per state per context and in total."""

    episode_id: str
    group_id: str
    closed: bool
    totals: dict[CallState, int]
    contexts: list[ContextSummary]
    # What the harness may have wired wrong (e.g. a worker started without a spawner), in words: at most
    # MAX_WARNINGS, then one line counting the rest
    warnings: list[str] = Field(default_factory=list)
    context_count: int = 0  # contexts in the whole ledger (`contexts` may be one page of them)
    next_offset: int | None = None  # the offset of the next page of contexts; None: this is the last


class LedgerAccounting(BaseModel):
    """The closing record of an episode's calls (ids sorted, so it does not depend on arrival order)."""

    episode_id: str
    group_id: str
    admitted: list[str]
    by_state: dict[CallState, list[str]]
    cancelled_at_close: list[str] = Field(default_factory=list)  # outstanding calls that close() cancelled
    per_context: dict[str, dict[CallState, int]]

    def check_complete(self) -> LedgerAccounting:
        """Raise IncompleteAccountingError unless every admitted id is in exactly one terminal state."""
        seen: dict[str, list[CallState]] = {}
        for state, ids in self.by_state.items():
            for call_id in ids:
                seen.setdefault(call_id, []).append(state)
        bad = {
            call_id: states
            for call_id in self.admitted
            if len(states := seen.get(call_id, [])) != 1 or states[0] not in TERMINAL_STATES
        }
        foreign = sorted(set(seen) - set(self.admitted))
        if bad or foreign:
            raise IncompleteAccountingError(
                f"episode {self.episode_id}: accounting is incomplete: calls not in exactly one terminal "
                f"state {bad}, calls accounted but never admitted {foreign}; expected every admitted call "
                f"in exactly one of {sorted(s.value for s in TERMINAL_STATES)}; close the ledger "
                "(close(cancel_outstanding=...)) before accounting, and report this if it persists"
            )
        return self


def account(
    episode_id: str, group_id: str, receipts: Iterable[CallReceipt], cancelled_at_close: Iterable[str]
) -> LedgerAccounting:
    """Build the accounting record of `receipts` (any order in, sorted ids out)."""
    receipts = sorted(receipts, key=lambda r: r.call_id)
    by_state: dict[CallState, list[str]] = {state: [] for state in CallState}
    per_context: dict[str, dict[CallState, int]] = {}
    for receipt in receipts:
        by_state[receipt.state].append(receipt.call_id)
        counts = per_context.setdefault(receipt.context_id, dict.fromkeys(CallState, 0))
        counts[receipt.state] += 1
    return LedgerAccounting(
        episode_id=episode_id,
        group_id=group_id,
        admitted=[r.call_id for r in receipts],
        by_state=by_state,
        cancelled_at_close=sorted(cancelled_at_close),
        per_context=dict(sorted(per_context.items())),
    )
