"""What the episode ledger holds, and the lookups every one of its rules reads (pure).

The state is small (receipts: ids, lengths, digests; never token arrays) and serialises with pydantic as
one payload (a hand-over carries it: ledger/handover.py). `LedgerState` holds:

- `contexts`: each context reservation (`ContextState`: its record, its call ids in admission order, the
  REWRITE context that retired it), in opening order;
- `calls`: the receipt of every call the workflow still holds, in admission order;
- `closed`, and the calls the close cancelled;
- the settled calls' tails and totals (ledger/settled.py) and the branch window they were settled with;
- the calls whose response has not reached its harness yet (ledger/delivery.py).

A context's *head* is its last admitted call that is not dead (discarded, failed or cancelled): the call
a plain continuation must extend. A call id the workflow no longer holds may be *settled* (dropped at a
hand-over: ledger/settlement.py); naming it where a live call is needed is a `SettledCallError`, naming
an id never admitted an `UnknownCallError`, and any change to a closed ledger a `LedgerClosedError`.

Beside the fields sits an index of the contexts by agent (`AgentIndex`): a cache, neither serialised nor
compared, rebuilt whenever the dict it indexed was replaced (a restore, a copy).

The rules (ledger/context_opening.py, admission.py, call_lifecycle.py, settlement.py) and the reports
(ledger/report.py) extend this class; ledger/ledger.py joins them into the `Ledger`.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field, PrivateAttr

from grove.receipts import CallReceipt, CallState, ContextOrigin, ContextRecord
from ledger.accounting import LedgerAccounting, account
from ledger.errors import (
    LedgerClosedError,
    LedgerError,
    SettledCallError,
    UnknownCallError,
    UnknownContextError,
)
from ledger.settled import SettledCalls, SettledTotals

# Calls that produced nothing anyone may build on: they leave their context's line.
DEAD_STATES: frozenset[CallState] = frozenset({CallState.DISCARDED, CallState.FAILED, CallState.CANCELLED})
# Calls whose tokens exist and that the harness may still extend.
LIVE_COMPLETED_STATES: frozenset[CallState] = frozenset(
    {CallState.COMPLETED, CallState.SELECTED, CallState.AUXILIARY}
)


class ContextState(BaseModel):
    """A context reservation plus its calls in admission order."""

    record: ContextRecord
    call_ids: list[str] = Field(default_factory=list)
    retired_by: str | None = None  # the REWRITE context that replaced this one


class AgentIndex:
    """agent -> its context ids in opening order, for one `contexts` dict; rebuilt when the dict is not the
    one it indexed (a restore, a copy: its id, size and last key differ). A cache, not state: any two
    indexes are equal, so a Ledger's equality is its fields'."""

    def __init__(self) -> None:
        self.by_agent: dict[str, list[str]] = {}
        self.roots: list[str] = []  # agents whose first context is a ROOT, in opening order
        self.key: tuple[int, int, str | None] = (0, -1, None)

    @staticmethod
    def _key(contexts: dict[str, ContextState]) -> tuple[int, int, str | None]:
        return id(contexts), len(contexts), next(reversed(contexts), None)

    def _current(self, contexts: dict[str, ContextState]) -> AgentIndex:
        if self.key != self._key(contexts):
            self.by_agent, self.roots = {}, []
            for state in contexts.values():
                self._note(state.record)
            self.key = self._key(contexts)
        return self

    def _note(self, record: ContextRecord) -> None:
        if record.agent not in self.by_agent and record.origin == ContextOrigin.ROOT:
            self.roots.append(record.agent)
        self.by_agent.setdefault(record.agent, []).append(record.context_id)

    def of(self, contexts: dict[str, ContextState], agent: str) -> list[str]:
        return self._current(contexts).by_agent.get(agent, [])

    def root_agents(self, contexts: dict[str, ContextState]) -> list[str]:
        return self._current(contexts).roots

    def add(self, contexts: dict[str, ContextState], record: ContextRecord, state: ContextState) -> None:
        """Open `state` in `contexts`, keeping the index instead of rebuilding it."""
        current = self.key == self._key(contexts)
        contexts[record.context_id] = state
        if current:
            self._note(record)
            self.key = self._key(contexts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AgentIndex)

    __hash__ = None  # type: ignore[assignment]


class LedgerState(BaseModel):
    """The state of one episode's ledger and its lookups (module docstring)."""

    episode_id: str
    group_id: str
    contexts: dict[str, ContextState] = Field(default_factory=dict)
    calls: dict[str, CallReceipt] = Field(default_factory=dict)  # admission order
    closed: bool = False
    cancelled_at_close: list[str] = Field(default_factory=list)
    # Calls dropped by `settle` (a long episode's hand-over): per context what its checks still need,
    # and the window they were settled with (0: nothing was ever settled; ledger/settled.py).
    settled: dict[str, SettledCalls] = Field(default_factory=dict)
    settled_totals: SettledTotals = Field(default_factory=SettledTotals)
    branch_window: int = 0
    # Completed (or generating) calls whose response has not reached its harness yet: the gateway's calls
    # until their `deliver` Update (ledger/delivery.py has the rules); never settled, frozen at close.
    awaiting_delivery: list[str] = Field(default_factory=list)
    # agent -> its context ids in opening order, kept beside `contexts` (not serialized, not compared), so
    # an opening's checks and the gateway's `context_view` do not scan every context of a long episode
    _agents: AgentIndex = PrivateAttr(default_factory=lambda: AgentIndex())

    # ------------------------------------------------------------------------------------ error helper

    def _error(
        self,
        cls: type[LedgerError],
        context_id: str | None,
        call_ids: Iterable[str],
        problem: str,
        expected: str,
        action: str,
    ) -> LedgerError:
        return cls(
            episode_id=self.episode_id,
            context_id=context_id,
            call_ids=call_ids,
            problem=problem,
            expected=expected,
            action=action,
        )

    # ------------------------------------------------------------------------------------ lookups

    def context(self, context_id: str, *, call_ids: Iterable[str] = ()) -> ContextState:
        state = self.contexts.get(context_id)
        if state is None:
            raise self._error(
                UnknownContextError,
                context_id,
                call_ids,
                f"context {context_id!r} was never opened",
                f"one of the open contexts {sorted(self.contexts)}",
                "open the context (open_context) before admitting calls into it",
            )
        return state

    def call(self, call_id: str, *, context_id: str | None = None) -> CallReceipt:
        receipt = self.calls.get(call_id)
        if receipt is None and self.settled_context(call_id) is not None:
            raise self._settled_error(call_id, context_id)
        if receipt is None:
            raise self._error(
                UnknownCallError,
                context_id,
                [call_id],
                f"call {call_id!r} was never admitted",
                "the id of an admitted call",
                "admit the call first, or fix the id the harness sent",
            )
        return receipt

    def settled_context(self, call_id: str) -> str | None:
        """The context of a settled call id; None when it is not settled (live, or never admitted)."""
        if not self.settled:
            return None
        prefix, dot_c, _ = call_id.rpartition(".c")
        tail = self.settled.get(prefix) if dot_c else None
        if tail is not None and tail.contains(call_id, prefix):
            return prefix
        for context_id, tail in self.settled.items():
            if call_id in tail.ids.other:
                return context_id
        return None

    def _settled_error(self, call_id: str, context_id: str | None) -> LedgerError:
        owner = self.settled_context(call_id)
        assert owner is not None
        window = self.contexts[owner].call_ids
        return self._error(
            SettledCallError,
            context_id or owner,
            [call_id],
            f"call {call_id!r} of context {owner!r} is settled: it is older than the context's branch window "
            f"(branch_window={self.branch_window}: the last {self.branch_window} calls of each context and "
            f"its head's last {self.branch_window} ancestors stay in the workflow); it was written to the "
            "episode's ledger pages, is still trained as the close decides, but can no longer be extended, "
            "branched from, discarded or spawn a worker",
            f"a call of context {owner!r}'s window: {window}",
            f"continue from the head {self.head(owner)!r} or branch from a call of the window; a harness "
            "that goes back further needs an episode started with a larger EpisodeSpec.branch_window",
        )

    def state_of(self, call_id: str) -> CallState | None:
        """A call's state, settled calls included (a settled completed call is COMPLETED until the close,
        whose SELECTED / AUXILIARY the materialize activity applies); None for an id never admitted."""
        receipt = self.calls.get(call_id)
        if receipt is not None:
            return receipt.state
        owner = self.settled_context(call_id)
        if owner is None:
            return None
        return self.settled[owner].state_of(call_id, owner)

    def head(self, context_id: str) -> str | None:
        """The call a plain continuation must extend: the last admitted call that is not dead."""
        for call_id in reversed(self.context(context_id).call_ids):
            if self.calls[call_id].state not in DEAD_STATES:
                return call_id
        return None

    def contexts_of(self, agent: str) -> list[str]:
        """The agent's context ids in opening order (an index: no scan of the other contexts)."""
        return self._agents.of(self.contexts, agent)

    def agents_opened_as_roots(self) -> list[str]:
        """Agents whose first context is a ROOT, in opening order (calls or not; see root_agents)."""
        return self._agents.root_agents(self.contexts)

    def agents(self) -> dict[str, list[str]]:
        """agent -> its context ids in opening order."""
        out: dict[str, list[str]] = {}
        for context_id, state in self.contexts.items():
            out.setdefault(state.record.agent, []).append(context_id)
        return out

    def receipts(self) -> list[CallReceipt]:
        return list(self.calls.values())

    def pending(self) -> list[str]:
        return [c for c, r in self.calls.items() if r.state == CallState.ADMITTED]

    def _check_open_ledger(self, context_id: str | None, call_ids: Iterable[str]) -> None:
        if self.closed:
            raise self._error(
                LedgerClosedError,
                context_id,
                call_ids,
                "the ledger is closed",
                "no changes after close()",
                "start a new episode; a closed episode's calls are final",
            )

    def _current_context(self, agent: str) -> str | None:
        for context_id in self.contexts_of(agent):
            if self.contexts[context_id].retired_by is None:
                return context_id
        return None

    def _used(self, call_id: str | None) -> None:
        if call_id in self.awaiting_delivery:
            self.awaiting_delivery.remove(call_id)

    def accounting(self) -> LedgerAccounting:
        """The accounting record of the calls the workflow holds (complete once closed)."""
        return account(self.episode_id, self.group_id, self.calls.values(), self.cancelled_at_close)
