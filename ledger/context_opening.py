"""Opening a context: the ROOT, SPAWN and REWRITE rules, who owns a context, and the rewrite lineage (pure).

Agents open *contexts* (context reservations), each an independent token stream of one agent, so calls of
different contexts may be outstanding at once. A context id is opened once, and by its origin:

- ROOT: an agent's first context, spawned by nobody and rewriting nothing (the root agent; an agent
  opened as ROOT beside it is warned about: ledger/report.py);
- SPAWN: a context started by a named call of *another* agent that is admitted or completed (a
  streaming response may start the agent before its receipt arrives). Any agent may be spawned again, a
  fresh history beside its earlier contexts: a worker invoked a second time (a second agent-as-tool
  invocation, a second LangGraph `Send` round), and the root agent too when another agent hands the
  conversation back to it (an Agents SDK handoff back: the history it gets holds the other agent's
  turns, so it extends none of its own contexts);
- REWRITE: a declared rewrite (compaction) of the same agent's current context, which it retires
  (`ContextState.retired_by`): a retired context admits no call and is rewritten only once.

Opening a SPAWN context marks its spawning call's response as used by its harness (ledger/delivery.py).
`validate_open_context` raises what `open_context` would raise, without changing anything (the
`open_context` Update's validator). Every refusal is an `InvalidReservationError`, a
`DuplicateContextError` or, for a rewrite of a retired context, a `StaleContinuationError`.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from grove.receipts import ContextOrigin, ContextRecord
from ledger.errors import (
    DuplicateContextError,
    InvalidReservationError,
    LedgerError,
    StaleContinuationError,
)
from ledger.state import DEAD_STATES, ContextState, LedgerState


class ContextOpening(LedgerState):
    """The ledger's context reservations (module docstring)."""

    def validate_open_context(self, record: ContextRecord) -> None:
        """Raise the error open_context would raise, without changing anything."""
        cid = record.context_id
        self._check_open_ledger(cid, [])
        if cid in self.contexts:
            raise self._error(
                DuplicateContextError,
                cid,
                [],
                f"context {cid!r} is already open",
                "a fresh context id per reservation",
                "reuse the open context or pick a new id",
            )
        origin_check = {
            ContextOrigin.ROOT: self._check_root,
            ContextOrigin.SPAWN: self._check_spawn,
            ContextOrigin.REWRITE: self._check_rewrite,
        }[record.origin]
        origin_check(record)

    def _invalid(
        self, record: ContextRecord, call_ids: Iterable[str], problem: str, expected: str, action: str
    ) -> LedgerError:
        return self._error(InvalidReservationError, record.context_id, call_ids, problem, expected, action)

    def _check_first_context(self, record: ContextRecord) -> None:
        existing = self.contexts_of(record.agent)
        if existing:
            raise self._invalid(
                record,
                [],
                f"agent {record.agent!r} already has contexts {existing}",
                f"a {record.origin.value} context only for an agent's first context",
                "open a REWRITE context of the agent's current context, or give the new agent its own name",
            )

    def _check_root(self, record: ContextRecord) -> None:
        if record.spawned_by_call is not None or record.rewrite_of is not None:
            raise self._invalid(
                record,
                [],
                "a ROOT context names a spawning call or a rewritten context",
                "ROOT with spawned_by_call=None and rewrite_of=None",
                "use origin SPAWN for a worker, REWRITE for a compaction",
            )
        self._check_first_context(record)

    def _check_spawn(self, record: ContextRecord) -> None:
        spawner_id = record.spawned_by_call
        if spawner_id is None or record.rewrite_of is not None:
            raise self._invalid(
                record,
                [],
                "a SPAWN context must name its spawning call and nothing it rewrites",
                "SPAWN with spawned_by_call set and rewrite_of=None",
                "pass the id of the call whose response started this worker",
            )
        spawner = self.call(spawner_id, context_id=record.context_id)
        if spawner.agent == record.agent:
            raise self._invalid(
                record,
                [spawner_id],
                f"call {spawner_id!r} belongs to agent {record.agent!r} itself",
                "a spawning call of another agent",
                "name the worker differently from the agent that spawns it, or open a REWRITE context",
            )
        # Admitted is enough: a streaming response may start the worker before its receipt arrives.
        if spawner.state in DEAD_STATES:
            raise self._invalid(
                record,
                [spawner_id],
                f"spawning call {spawner_id!r} is {spawner.state.value}",
                "a spawning call that is admitted or completed",
                "spawn workers only from responses the harness actually uses",
            )
        # An agent with contexts already is spawned again (module docstring): its earlier contexts stay
        # live, since the invocations may run concurrently.

    def _check_rewrite(self, record: ContextRecord) -> None:
        old_id = record.rewrite_of
        if old_id is None or record.spawned_by_call is not None:
            raise self._invalid(
                record,
                [],
                "a REWRITE context must name the context it rewrites and no spawning call",
                "REWRITE with rewrite_of set and spawned_by_call=None",
                "pass the agent's current context id as rewrite_of",
            )
        old = self.context(old_id)
        if old.record.agent != record.agent:
            raise self._invalid(
                record,
                [],
                f"context {old_id!r} belongs to agent {old.record.agent!r}, not {record.agent!r}",
                "a rewrite of the same agent's current context",
                "rewrite only the agent's own context; a new agent needs a SPAWN context",
            )
        if old.retired_by is not None:
            raise self._error(
                StaleContinuationError,
                record.context_id,
                [],
                f"context {old_id!r} was already rewritten by context {old.retired_by!r}",
                f"a rewrite of agent {record.agent!r}'s current context",
                f"rewrite {self._current_context(record.agent)!r} instead",
            )

    def open_context(self, record: ContextRecord) -> ContextRecord:
        """Open a context reservation; a REWRITE retires the context it replaces."""
        self.validate_open_context(record)
        self._agents.add(self.contexts, record, ContextState(record=record))
        self._used(record.spawned_by_call)  # a response that spawned a worker reached its harness
        if record.origin == ContextOrigin.REWRITE and record.rewrite_of is not None:  # validated: it is set
            self.contexts[record.rewrite_of].retired_by = record.context_id
        return record
