"""The episode ledger: the workflow state that admits, tracks and accounts for every model call.

An `EpisodeWorkflow` holds one `Ledger`. Agents open *contexts* (context reservations): the root
agent's first context, a worker's context spawned by a named call of another agent, or a declared
rewrite (compaction) of the agent's own current context, which retires the old one. Contexts are
independent, so calls of different contexts may be outstanding at once. Within a context:

- the first call is the context's root (`extends=None`; also a retry of a root that failed, was
  cancelled or discarded);
- a later call extends the context's *head* — the last admitted call that is not discarded, failed
  or cancelled — or names an older completed call with `branch=True` (a fork, a kept retry);
- `extends=None` in a context that already has calls is an undeclared discontinuity: a rewrite
  must open a REWRITE context;
- a call can only extend a *completed* call (its tokens must exist).

Calls move admitted -> completed -> exactly one terminal state (selected, discarded, auxiliary,
cancelled, failed), or straight from admitted to failed, cancelled, or discarded (`abandon`: a lost
generation attempt that is retried under a new call id). `close()` resolves completed calls to
selected/auxiliary, cancels outstanding calls only when told to, and returns an accounting record in
which every admitted call id appears in exactly one terminal state.

Every rule violation raises a `LedgerError` subclass carrying episode id, context id, call ids, what
was expected and what to do. `validate_*` methods raise the same errors without mutating (Temporal
Update validators call them). Repeating a transition that already happened with the same data is a
no-op, so retried Updates are harmless.

The state is small (receipts: ids, lengths, digests; never token arrays) and serialises with pydantic.
Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field, PrivateAttr

from grove.receipts import (
    CallKind,
    CallReceipt,
    CallState,
    ContextOrigin,
    ContextRecord,
    TokenDigests,
    ToolCallOutcome,
)
from grove.sampling import SamplingProcessing
from workflows.accounting import (
    ContextSummary,
    LedgerAccounting,
    LedgerSummary,
    account,
    count_states,
)
from workflows.ancestry import AncestryEvidence, candidate_ranges, match_candidates
from workflows.settled import SettledCalls, SettledTotals

# Calls that produced nothing anyone may build on: they leave their context's line.
DEAD_STATES: frozenset[CallState] = frozenset({CallState.DISCARDED, CallState.FAILED, CallState.CANCELLED})
# Calls whose tokens exist and that the harness may still extend.
LIVE_COMPLETED_STATES: frozenset[CallState] = frozenset(
    {CallState.COMPLETED, CallState.SELECTED, CallState.AUXILIARY}
)


# ----------------------------------------------------------------------------------------------- errors


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


# ----------------------------------------------------------------------------------------------- models


class AdmitRequest(BaseModel):
    """Payload of the admission Update: one call about to be generated."""

    call_id: str
    context_id: str
    kind: CallKind = CallKind.ACTION
    extends: str | None = None  # the call whose prompt + completion this call's prompt starts with
    branch: bool = False  # True: `extends` may be an older call than the head (fork / kept retry)


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


class Ledger(BaseModel):
    """Workflow state of one episode. See the module docstring for the rules."""

    episode_id: str
    group_id: str
    contexts: dict[str, ContextState] = Field(default_factory=dict)
    calls: dict[str, CallReceipt] = Field(default_factory=dict)  # admission order
    closed: bool = False
    cancelled_at_close: list[str] = Field(default_factory=list)
    # Calls dropped by `settle` (a long episode's hand-over): per context what its checks still need,
    # and the window they were settled with (0: nothing was ever settled; workflows/settled.py).
    settled: dict[str, SettledCalls] = Field(default_factory=dict)
    settled_totals: SettledTotals = Field(default_factory=SettledTotals)
    branch_window: int = 0
    # Completed (or generating) calls whose response has not reached its harness yet: the gateway's calls
    # until their `deliver` Update (workflows/delivery.py has the rules); never settled, frozen at close.
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

    # ------------------------------------------------------------------------------------ contexts

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
        self._check_respawn(record)

    def _check_respawn(self, record: ContextRecord) -> None:
        """A worker may be spawned again (a fresh history: a second agent-as-tool invocation, a second
        LangGraph `Send` round): another SPAWN context of an agent whose first context was a SPAWN too.
        Its earlier contexts stay live (the invocations may run concurrently); the root agent, opened
        as ROOT, is never spawned."""
        existing = self.contexts_of(record.agent)
        if existing and self.contexts[existing[0]].record.origin != ContextOrigin.SPAWN:
            raise self._invalid(
                record,
                [],
                f"agent {record.agent!r} started as a {self.contexts[existing[0]].record.origin.value} "
                f"context ({existing[0]!r}), so it is not a worker",
                "a SPAWN context only for a new agent or for an agent that was spawned before",
                "give the spawned worker its own agent name",
            )

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

    def _current_context(self, agent: str) -> str | None:
        for context_id in self.contexts_of(agent):
            if self.contexts[context_id].retired_by is None:
                return context_id
        return None

    def open_context(self, record: ContextRecord) -> ContextRecord:
        """Open a context reservation; a REWRITE retires the context it replaces."""
        self.validate_open_context(record)
        self._agents.add(self.contexts, record, ContextState(record=record))
        self._used(record.spawned_by_call)  # a response that spawned a worker reached its harness
        if record.origin == ContextOrigin.REWRITE:
            self.contexts[record.rewrite_of].retired_by = record.context_id
        return record

    # ------------------------------------------------------------------------------------ admission

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
        response counts only once delivered (workflows/delivery.py); else delivered on completion."""
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

    def _used(self, call_id: str | None) -> None:
        if call_id in self.awaiting_delivery:
            self.awaiting_delivery.remove(call_id)

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

    # ------------------------------------------------------------------------------------ transitions

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
        DISCARDED, never trained; the retry is a new admission with a new call id (DESIGN.md section 8)."""
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
        any more: refused (workflows/settled.py `cut`)."""
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

    # ------------------------------------------------------------------------------------ close

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
                    final = CallState.AUXILIARY if receipt.kind == CallKind.AUXILIARY else CallState.SELECTED
                    self.calls[call_id] = receipt.model_copy(update=dict(state=final))
            self.closed = True
        return self.accounting().check_complete()

    # ------------------------------------------------------------------------------------ settling

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
        (workflows/settled.py); returns how many were dropped. The caller has written them first: the
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

    # ------------------------------------------------------------------------------------ reporting

    def accounting(self) -> LedgerAccounting:
        return account(self.episode_id, self.group_id, self.calls.values(), self.cancelled_at_close)

    def summary(self) -> LedgerSummary:
        """Counts per state per context and in total, pending ids, and each context's origin links
        (spawned by which call, rewrite of which context, retired by which) (the Temporal query answer).
        Settled calls count in the state they were settled in (completed or dead: the close's SELECTED /
        AUXILIARY of a settled call is applied by the materialize activity, not here)."""
        contexts = [self.context_summary(context_id) for context_id in self.contexts]
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
            warnings=self.warnings(),
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
