"""What an episode's ledger keeps of the calls it has settled (dropped from workflow state) (pure).

A long episode's workflow hands over to its next run with only its *live* calls (ledger/settlement.py
`settle`); every other call is *settled*: written in the episode's ledger pages (which the
materialize activity joins) and dropped from the workflow. Per context the ledger keeps this small tail
instead, so its checks and reports stay exact without the calls:

- `ids`: which call ids were settled, as ranges of `n` for the canonical ids `{context}.c{n}` (what the
  gateway and the native harness assign, increasing per context) plus a list of any other id (a lost
  attempt's `{id}.r{k}`, a hand-picked id). A duplicate of a settled id is refused without the id set;
  a name of one (extends, branch, discard, spawn) is refused as settled, not as unknown;
- `dead`: the settled ids per dead state (discarded, failed, cancelled), so a call's state stays known;
- counts per state (the summary and context_view queries count every call: the gateway numbers calls
  from them), how many settled completed calls are auxiliary (the close makes them AUXILIARY, the others
  SELECTED), whether any was an action, the last completed action (the reward's `last_outputs`);
- `cut`: the oldest live call that is newer than every settled call that is not dead. A context's head
  is its newest call that is not dead, so while the head the live calls give is `cut` or newer it is
  the true head; a discard that would make an older call the head is refused, because a settled call
  is the true head then.

The sizes are per context and per range of ids, not per call: a context whose calls follow the
canonical numbering keeps one range however many calls it settled.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from pydantic import BaseModel, Field

from grove.receipts import CallKind, CallReceipt, CallState, ToolCallOutcome

DEAD = (CallState.DISCARDED, CallState.FAILED, CallState.CANCELLED)


def canonical_index(call_id: str, context_id: str) -> int | None:
    """n of `{context_id}.c{n}` (no leading zeros: `c05` is another id than `c5`), else None."""
    prefix = f"{context_id}.c"
    if not call_id.startswith(prefix):
        return None
    digits = call_id[len(prefix) :]
    if not digits.isdigit() or not digits.isascii() or str(int(digits)) != digits:
        return None
    return int(digits)


class IdRanges(BaseModel):
    """A set of call ids of one context: inclusive ranges of canonical `n`, plus other ids verbatim."""

    spans: list[tuple[int, int]] = Field(default_factory=list)  # sorted, disjoint, not adjacent
    other: list[str] = Field(default_factory=list)

    def contains(self, call_id: str, context_id: str) -> bool:
        n = canonical_index(call_id, context_id)
        if n is None:
            return call_id in self.other
        i = bisect_right(self.spans, (n, float("inf"))) - 1
        return i >= 0 and self.spans[i][0] <= n <= self.spans[i][1]

    def add(self, call_ids: Iterable[str], context_id: str) -> None:
        found: list[tuple[int, int]] = list(self.spans)
        for call_id in call_ids:
            n = canonical_index(call_id, context_id)
            if n is None:
                self.other.append(call_id)
            else:
                found.append((n, n))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(found):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self.spans = merged

    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.spans) + len(self.other)


class SettledCalls(BaseModel):
    """One context's settled calls, as the ledger keeps them once the calls are gone (module docstring)."""

    ids: IdRanges = Field(default_factory=IdRanges)
    dead: dict[CallState, IdRanges] = Field(default_factory=dict)
    counts: dict[CallState, int] = Field(default_factory=dict)  # states when settled
    completed_auxiliary: int = 0  # of counts[COMPLETED]: kind auxiliary (AUXILIARY at close)
    has_action: bool = False
    last_action: str | None = None  # the last completed action call among the settled ones
    cut: str | None = None  # the oldest live call newer than every settled call that is not dead

    def absorb(self, context_id: str, receipts: list[CallReceipt], cut: str | None) -> None:
        """Record `receipts` (in admission order) as settled."""
        self.ids.add((r.call_id for r in receipts), context_id)
        for state in DEAD:
            gone = [r.call_id for r in receipts if r.state == state]
            if gone:
                self.dead.setdefault(state, IdRanges()).add(gone, context_id)
        for r in receipts:
            self.counts[r.state] = self.counts.get(r.state, 0) + 1
            if r.state == CallState.COMPLETED and r.kind.auxiliary:
                self.completed_auxiliary += 1
            if r.kind == CallKind.ACTION:
                self.has_action = True
                if r.state in (CallState.COMPLETED, CallState.SELECTED):
                    self.last_action = r.call_id
        self.cut = cut

    def contains(self, call_id: str, context_id: str) -> bool:
        return self.ids.contains(call_id, context_id)

    def state_of(self, call_id: str, context_id: str) -> CallState:
        """A settled call's state (before the close: a settled call is completed or dead)."""
        for state, ids in self.dead.items():
            if ids.contains(call_id, context_id):
                return state
        return CallState.COMPLETED

    def non_dead(self) -> int:
        return sum(n for state, n in self.counts.items() if state not in DEAD)

    def closed_counts(self) -> dict[CallState, int]:
        """The counts as the close leaves them: completed calls selected, or auxiliary by kind."""
        out: dict[CallState, int] = {s: n for s, n in self.counts.items() if s != CallState.COMPLETED}
        completed = self.counts.get(CallState.COMPLETED, 0)
        for state, n in (
            (CallState.SELECTED, completed - self.completed_auxiliary),
            (CallState.AUXILIARY, self.completed_auxiliary),
        ):
            if n:
                out[state] = out.get(state, 0) + n
        return out


class SettledTotals(BaseModel):
    """Episode-wide numbers of the settled calls that the result reports (EpisodeResult.call_stats,
    policy_versions) when materialize could not give them from the pages (a placeholder episode)."""

    tool_calls: dict[ToolCallOutcome, int] = Field(default_factory=dict)
    policy_versions: list[int] = Field(default_factory=list)

    def absorb(self, receipts: list[CallReceipt]) -> None:
        for r in receipts:
            if r.tool_call is not None:
                self.tool_calls[r.tool_call] = self.tool_calls.get(r.tool_call, 0) + 1
        versions = {r.policy_version for r in receipts if r.policy_version is not None}
        self.policy_versions = sorted(set(self.policy_versions) | versions)
