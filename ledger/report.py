"""What the ledger tells its readers: the summary, each context's summary, root agents, last outputs (pure).

- `summary()` (the workflow's `summary` query): counts per state per context and in total, each context's
  origin links (spawned by which call, rewrite of which context, retired by which), head, pending calls
  and calls awaiting delivery, and warnings (the models are ledger/accounting.py's). The query
  answers one page of contexts (`SummaryPage`) and at most MAX_WARNINGS warnings, so its payload stays
  bounded however many contexts the episode opens. Settled calls count
  in the state they were settled in: the close's SELECTED / AUXILIARY of a settled call is applied by the
  materialize activity, not here;
- `context_summary`: one context as the queries show it (the `context_view` query answers with a few:
  ledger/context_view.py);
- `root_agents` and `warnings`: the agents with a ROOT context that holds a policy action; every one after
  the first was most likely a worker whose harness did not say who spawned it;
- `last_outputs`: each agent's last selected action call, the outputs of an external harness that closed
  without naming them (the reward reads their responses).

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from itertools import islice

from grove.receipts import CallKind, CallState, ContextOrigin
from ledger.accounting import MAX_WARNINGS, ContextSummary, LedgerSummary, count_states
from ledger.state import LedgerState


class LedgerReport(LedgerState):
    """The ledger's answers to queries and to the reward (module docstring)."""

    def summary(self, offset: int = 0, limit: int | None = None) -> LedgerSummary:
        """Counts per state per context and in total, pending ids, and each context's origin links
        (spawned by which call, rewrite of which context, retired by which) (the Temporal query answer).
        `limit` contexts from `offset` in opening order (None: all; `next_offset` names the next page).
        Settled calls count in the state they were settled in (completed or dead: the close's SELECTED /
        AUXILIARY of a settled call is applied by the materialize activity, not here)."""
        stop = None if limit is None else offset + limit
        page = list(islice(self.contexts, offset, stop))
        contexts = [self.context_summary(context_id) for context_id in page]
        totals = count_states(self.calls.values())
        for tail in self.settled.values():
            for call_state, n in tail.counts.items():
                totals[call_state] += n
        return LedgerSummary(
            episode_id=self.episode_id,
            group_id=self.group_id,
            closed=self.closed,
            totals=totals,
            contexts=contexts,
            warnings=bounded(self.warnings()),
            context_count=len(self.contexts),
            next_offset=stop if stop is not None and stop < len(self.contexts) else None,
        )

    def context_summary(self, context_id: str) -> ContextSummary:
        """One context as the queries show it: its links, head, counts (settled calls included), pending."""
        state = self.contexts[context_id]
        receipts = [self.calls[c] for c in state.call_ids]
        counts = count_states(receipts)
        tail = self.settled.get(context_id)
        for call_state, n in (tail.counts if tail else {}).items():
            counts[call_state] += n
        return ContextSummary(
            context_id=context_id,
            agent=state.record.agent,
            origin=state.record.origin,
            spawned_by_call=state.record.spawned_by_call,
            rewrite_of=state.record.rewrite_of,
            retired_by=state.retired_by,
            head=self.head(context_id),
            counts=counts,
            pending=[r.call_id for r in receipts if r.state == CallState.ADMITTED],
            awaiting_delivery=[c for c in state.call_ids if c in self.awaiting_delivery],
        )

    def root_agents(self) -> list[str]:
        """Agents with a ROOT context that holds a policy action (auxiliary-only agents excluded), in
        the order their contexts were opened."""
        roots: list[str] = []
        for state in self.contexts.values():
            if state.record.origin != ContextOrigin.ROOT or state.record.agent in roots:
                continue
            tail = self.settled.get(state.record.context_id)
            if (tail is not None and tail.has_action) or any(
                self.calls[c].kind == CallKind.ACTION for c in state.call_ids
            ):
                roots.append(state.record.agent)
        return roots

    def last_outputs(self) -> dict[str, str]:
        """agent -> its last selected (or completed) action call: the last such call of the agent's
        most recently opened context that has one (an external harness that closes without outputs)."""
        last: dict[str, str] = {}
        for state in self.contexts.values():
            # settled calls are older than the live ones of their context, except ancestors of the head
            # that stay live (a fork's older branch point): then the live one is taken
            tail = self.settled.get(state.record.context_id)
            if tail is not None and tail.last_action is not None:
                last[state.record.agent] = tail.last_action
            for call_id in state.call_ids:
                receipt = self.calls[call_id]
                if receipt.kind == CallKind.ACTION and receipt.state in (
                    CallState.SELECTED,
                    CallState.COMPLETED,
                ):
                    last[receipt.agent] = call_id
        return dict(sorted(last.items()))

    def warnings(self) -> list[str]:
        """Every root agent after the first was opened without a spawner: most likely a worker whose
        harness did not say who spawned it (it trains as an independent root with no spawn link)."""
        roots = self.root_agents()
        return [
            f"agent {agent!r} has no spawner: it was opened as an independent root beside the root agent "
            f"{roots[0]!r}; if a call of another agent started it, send its requests with "
            "x-grove-spawned-by (the x-grove-call-id of that call) so the spawn is linked "
            "(EpisodeSpec.unspawned_agents='refuse' makes this an error)"
            for agent in roots[1:]
        ]


def bounded(warnings: list[str]) -> list[str]:
    """At most MAX_WARNINGS warnings, then one line counting the ones left out."""
    if len(warnings) <= MAX_WARNINGS:
        return warnings
    left = len(warnings) - MAX_WARNINGS
    return [*warnings[:MAX_WARNINGS], f"... and {left} more warning(s) of the same kinds"]
