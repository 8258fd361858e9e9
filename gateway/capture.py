"""One chat request of an external harness, captured: route it to its context, decide how it relates to
the context's head, admit it through the episode's Updates, and record what the harness got.

    spec      -> sampling (the episode's, with the request's overrides; 400 before anything runs)
    view      -> the `context_view` of the agents the headers may name (gateway/routing.py
                 view_request; workflows/context_view.py): what routing needs, never the whole summary
              -> identity (headers) -> target context (gateway/routing.py); a new agent without a
                 spawner is refused (400 UnspawnedAgentError) when the episode's spec says
                 `unspawned_agents="refuse"`, else accepted (the summary query warns); another agent's
                 context is refused (403 ContextOwnershipError)
    spawn     -> a request that names its spawner (identity.respawn) goes to the live context of its
                 agent that it extends or repeats, else opens a new SPAWN context (a worker invoked
                 again with a fresh history); contexts still generating are never candidates
    head      -> still generating: 409 HeadPendingError; still being delivered by a request of this
                 gateway: 409 ResponsePendingError (Retry-After); else its chat record (a completed
                 head without one, or awaiting delivery in the ledger, whose request is gone, was never
                 delivered: discard it, redo)
    decision  -> ROOT / CONTINUE / RETRY / SKIP_EMPTY / REWRITE or 400 (gateway/continuation.py); nothing is
                 admitted for a refused request, and the error names the header that fixes the common
                 mistakes (gateway/hints.py)
    fit       -> the call's prompt ids built as the generate activity will build them: a prompt that
                 does not fit the served model's context is a 400 context_length_exceeded
                 (gateway/context_window.py), before anything is opened, discarded or admitted
    act       -> open_context (new agent, or a rewrite), discard (retry), call -> CallResult (a large
                 completion by reference: read from the store and verified, capture/claims.py)
    record    -> written before the response leaves (capture/records.py)
    delivery  -> `Delivery`: the route records the delivery in the ledger (the `deliver` Update) just
                 before the response's last part, and settles it (gateway/delivery.py): not delivered ->
                 the call is discarded, never trained; a close freezes the rest (workflows/delivery.py)

Delivery and its races. A call's response is "being delivered" from its call Update until the route has
sent its last byte or given up; this gateway process knows which of its own requests are in that window
(`Capture._delivering`, liveness, not state: nothing there outlives the request). Another request of the
same context in that window gets a retryable 409 instead of a decision on a head that may be about to be
delivered (it must not discard it). Several gateway replicas do not share that knowledge: route all
requests of an episode to one replica (the episode reference is in the path). At close the ledger
itself discards every completed call whose delivery it has not recorded (workflows/delivery.py).

Planning is serialised per episode within this gateway process (`_planning`): from the view query
to the registration of the new call id, so two concurrent first requests of a worker spawned twice see
each other's new context and open two, never one twice. Generation runs outside it.

Call ids are deterministic per context: `{context_id}.c{n}`, n = the context's number of calls so far.
A chat continuation names its parent's staged arrays, and the generate activity splices the parent's
exact tokens in front of the new messages (grove.contracts.ChatPrompt).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from capture.claims import completion_of, stash_prompt
from capture.records import ChatRecord, Usage, load_record, save_record
from gateway import opencode
from gateway.chat_request import ChatCompletionRequest, sampling_for
from gateway.context_window import ContextWindow
from gateway.continuation import Decision, Move, UndeclaredDiscontinuityError, decide
from gateway.episodes import EpisodeError, Episodes, EpisodeUpdateRejectedError
from gateway.hints import UndeclaredAuxiliaryCallError, diagnose, rewrite_error, summary_message
from gateway.identity import AUX_SEPARATOR, DEFAULT_AGENT, Identity, aux_agent
from gateway.opencode_names import session_names
from gateway.replay import (
    SessionAlias,
    claimed_agents,
    index_call,
    indexed_calls,
    launch_of,
    load_aliases,
    program_agent,
    program_session,
    prompt_digest,
    replay_agent,
    save_alias,
)
from gateway.routing import (
    Target,
    current_context,
    fresh_context,
    identify,
    live_contexts,
    route,
    spawn_target,
    spawning_call,
    view_request,
)
from gateway.tokenization import Tokenization
from grove.contracts import CallRequest, CallResult, ChatPrompt, Completion, EpisodeSpec, PromptSpec
from grove.gates import Gates
from grove.headers import AGENT_HEADER, KIND_HEADER, PARENT_CONTEXT_HEADER, SPAWNED_BY_HEADER
from grove.receipts import CallKind, ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from storage.base import ObjectStore
from trainer.staging_format import staging_key
from workflows.accounting import ContextSummary
from workflows.context_view import ContextView, ViewRequest

log = logging.getLogger("grove.gateway")

LIVE_STATES = frozenset({"completed", "selected", "auxiliary"})  # calls a relaunch may be answered from
MAX_RECOVERIES = 3  # undelivered heads discarded before giving up on one request
_REPLAN = object()  # _head's answer after discarding an undelivered head


class CaptureError(Exception):
    """Base of the capture errors that are not the ledger's or the request's."""


class EpisodeClosedError(CaptureError):
    """The episode's ledger is closed: the harness closed it, no more calls (HTTP 409)."""


class HeadPendingError(CaptureError):
    """The context's head is still generating: the harness sent the next request too early (HTTP 409)."""


class ResponsePendingError(CaptureError):
    """The context's head has completed and its response is still being delivered by this gateway
    (HTTP 409 with Retry-After): the request came before that response left; retry it shortly."""

    retry_after = 1  # seconds: delivering a finished call takes milliseconds

    def __init__(self, message: str, *, episode_id: str, context_id: str, call_id: str) -> None:
        super().__init__(message)
        self.episode_id, self.context_id, self.call_id = episode_id, context_id, call_id


class ForeignSessionError(CaptureError):
    """An OpenCode root session that is not the session the episode's parent agent runs in (HTTP 400)."""


class MissingRecordError(CaptureError):
    """The chat record of a call the request builds on is missing (HTTP 409)."""


class ContextConflictError(CaptureError):
    """A concurrent request opened the same context id with another reservation (HTTP 409)."""


class DeliveryRefusedError(CaptureError):
    """A completed call whose delivery the ledger refused (the episode was closed first): its response is
    not sent and does not count (HTTP 409)."""


class UndeliveredHeadsError(CaptureError):
    """Too many undelivered heads of one context in a row (HTTP 409)."""


class UnspawnedAgentError(CaptureError):
    """A new agent without a spawner in an episode whose spec refuses them (HTTP 400)."""

    param = SPAWNED_BY_HEADER


@dataclass(frozen=True)
class Plan:
    target: Target
    identity: Identity
    decision: Decision


@dataclass
class Delivery:
    """A captured call whose response is on its way: `commit` just before its last part is sent,
    `settle` once, when the route is done with it (gateway/delivery.py)."""

    capture: Capture
    record: ChatRecord
    requested: str  # the call id the request asked for (the record's may carry a lost-attempt suffix)
    replayed: bool = False  # answered from an earlier launch's record (gateway/replay.py): nothing to settle
    _settled: bool = field(default=False, repr=False)

    async def commit(self) -> None:
        """The response's last part is about to go to a connected client: record the delivery in the
        ledger (a replayed call's too: its first launch may never have got it). DeliveryRefusedError when
        the ledger refuses it (a close came first): the response must not be sent as delivered."""
        episode_id, call_id = self.record.episode_id, self.record.call_id
        try:
            await self.capture.episodes.deliver(episode_id, call_id)
        except EpisodeUpdateRejectedError as err:
            raise DeliveryRefusedError(
                f"episode {episode_id!r}: call {call_id!r} completed, but its delivery was refused "
                f"({err.error_type}: {err}); the response is not sent and is not trained. Start a new "
                "episode for a new attempt"
            ) from None

    async def settle(self, delivered: bool) -> None:
        """Delivered: nothing more to do. Not delivered: discard the call (never trained as an action);
        a harness retry of it then extends what it extended."""
        if self._settled:
            return
        self._settled = True
        if self.replayed:  # the call belongs to the ledger already; a relaunch that died replays it again
            return
        try:
            if not delivered:
                await self.capture.discard_quietly(
                    self.record.episode_id,
                    self.record.call_id,
                    "response not delivered: the client went away before its last part was sent",
                )
        finally:
            self.capture.release(self.record.episode_id, self.requested)


class Capture:
    """Captures chat requests into episode workflows; stateless (Temporal + object store), apart from
    knowing which of its own requests are still delivering a response."""

    def __init__(
        self,
        episodes: Episodes,
        store: ObjectStore,
        window: ContextWindow | None = None,
        tokens: Tokenization | None = None,
    ) -> None:
        self.episodes = episodes
        self.store = store
        self.window = window  # None: prompt lengths are not checked here (the engine refuses, 502)
        self.tokens = tokens  # measures off the event loop, bounded (gateway/tokenization.py)
        self._delivering: Counter[tuple[str, str]] = Counter()  # (episode, requested call id) -> requests
        self._replay_locks: dict[str, asyncio.Lock] = {}  # one claim at a time per episode (replay.py)
        self._plan_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # episode -> (lock, requests using it)
        self.gates = Gates.from_env()  # tests only (grove/gates.py): hold a request, a delivery

    def release(self, episode_id: str, requested: str) -> None:
        key = (episode_id, requested)
        self._delivering[key] -= 1
        if self._delivering[key] <= 0:
            del self._delivering[key]

    def delivering(self, episode_id: str, call_id: str) -> bool:
        """Whether a request of this gateway is still delivering `call_id` (or the lost-attempt retry
        `{requested}.r{n}` it completed as)."""
        return any(
            ep == episode_id and (call_id == requested or call_id.startswith(f"{requested}.r"))
            for ep, requested in self._delivering
        )

    async def discard_quietly(self, episode_id: str, call_id: str, reason: str) -> None:
        """Discard a response nobody got; a refusal (already discarded, extended, ledger closed) is
        logged, not raised: the ledger's state then says the response was used or settled."""
        try:
            await self.episodes.discard(episode_id, call_id, reason)
        except EpisodeError as err:
            log.warning("episode %r: call %r not discarded (%s): %s", episode_id, call_id, reason, err)

    async def _record(self, episode_id: str, call_id: str) -> ChatRecord | None:
        return await asyncio.to_thread(load_record, self.store, episode_id, call_id)

    async def chat(
        self, episode_id: str, request: ChatCompletionRequest, headers: Mapping[str, str]
    ) -> ChatRecord:
        """Capture one request and hand its record (what the harness gets) straight to the caller: it is
        delivered once this returns. HTTP routes use `chat_delivery` and settle after sending."""
        delivery = await self.chat_delivery(episode_id, request, headers)
        delivered = False
        try:
            await delivery.commit()
            delivered = True
        finally:
            await delivery.settle(delivered)
        return delivery.record

    async def chat_delivery(
        self, episode_id: str, request: ChatCompletionRequest, headers: Mapping[str, str]
    ) -> Delivery:
        """Capture one request; returns its delivery, which the caller must `settle` once the response
        was sent (or not)."""
        launch = launch_of(headers)
        if self.tokens is not None:  # a prompt whose text alone cannot fit: refused before anything else
            await asyncio.to_thread(self.tokens.refuse_unfit, request.messages)
        if self.gates is not None:  # tests: a harness's request arrived, nothing is decided yet
            await self.gates.hold("chat_request", request_gate_key(episode_id, launch, headers, request))
        spec = await self.episodes.spec(episode_id)
        sampling = sampling_for(request, spec.sampling)
        if launch is not None and launch > 1:
            async with self._replay_lock(episode_id):
                replayed = await self._replay(episode_id, request, headers, launch)
            if replayed is not None:
                return replayed
        async with self._planning(episode_id):
            for _ in range(MAX_RECOVERIES):
                plan = await self._plan(episode_id, request, headers, launch, spec)
                if plan is not None:
                    break
            else:
                raise UndeliveredHeadsError(
                    f"episode {episode_id!r}: {MAX_RECOVERIES} heads in a row were never delivered (no chat "
                    "record, or no delivery recorded in the ledger); check the gateway's object store and "
                    "its log, then retry the request"
                )
            call = await self._prepare(episode_id, request, plan, sampling, sampling or spec.sampling)
        return await self._admit(episode_id, request, plan, call, launch)

    @asynccontextmanager
    async def _planning(self, episode_id: str) -> AsyncIterator[None]:
        """One request of the episode plans at a time in this process (see the module docstring)."""
        lock, users = self._plan_locks.get(episode_id, (asyncio.Lock(), 0))
        self._plan_locks[episode_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._plan_locks[episode_id]
            if users <= 1:
                del self._plan_locks[episode_id]
            else:
                self._plan_locks[episode_id] = (lock, users - 1)

    async def _plan(
        self,
        episode_id: str,
        request: ChatCompletionRequest,
        headers: Mapping[str, str],
        launch: int | None,
        spec: EpisodeSpec,
    ) -> Plan | None:
        """The plan for this request; None after discarding an undelivered head (plan again)."""
        relaunch = launch is not None and launch > 1
        aliases = await asyncio.to_thread(load_aliases, self.store, episode_id, launch) if relaunch else {}
        names = await session_names(  # OpenCode's subagents by their agent type (gateway/opencode_names.py)
            self.store, episode_id, headers, request.messages,
            lambda agent: self._head_of(episode_id, agent), lambda call_id: self._record(episode_id, call_id),
            {s: a.agent for s, a in aliases.items()},
        )  # fmt: skip
        view = await self.episodes.context_view(episode_id, view_request(headers, names))
        if view.closed or view.closing:
            raise EpisodeClosedError(
                f"episode {episode_id!r} is closed (its ledger is settled); no more calls. Start a new "
                "episode for a new attempt"
            )
        identity = identify(headers, request.messages, request.tools, view, names)
        if relaunch and identity.root_session and identity.session_id:
            # A relaunch's root session is the episode's parent, even where nothing could be replayed.
            alias = SessionAlias(agent=identity.agent or DEFAULT_AGENT)
            await asyncio.to_thread(save_alias, self.store, episode_id, launch, identity.session_id, alias)
            aliases[identity.session_id] = alias
            identity = replace(identity, root_session=False)
        target = route(view, identity)
        if identity.respawn and identity.context_id is None and target.current is not None:
            return await self._spawn_plan(episode_id, request, identity, view, target.agent)
        _check_unspawned(spec, view, identity, target)
        head = await self._head(episode_id, target, relaunch)
        if head is _REPLAN:
            return None
        alias = aliases.get(_session_of(identity))
        if relaunch and alias is not None and isinstance(head, ChatRecord):
            head, forced = await self._diverge(episode_id, head, alias, launch)
            if forced is not None:
                return Plan(target, identity, forced)
        _check_session(episode_id, identity, head)
        try:
            decision = decide(request.messages, request.tools, head, identity.rewrite)
        except UndeclaredDiscontinuityError as err:
            summaries = await self._summaries(episode_id, view, target.agent)
            raise diagnose(err, request.messages, request.tools, identity, head, summaries) from None
        return Plan(target, identity, decision)

    async def _summaries(self, episode_id: str, summary: ContextView, agent: str) -> list[ChatRecord]:
        """The records of the heads of the agent's auxiliary contexts (its possible summary calls)."""
        records = []
        for purpose in ("aux", "summary"):
            ctx = current_context(summary, aux_agent(agent, purpose))
            if ctx is not None and ctx.head is not None and ctx.head not in ctx.pending:
                record = await self._record(episode_id, ctx.head)
                if record is not None:
                    records.append(record)
        return records

    async def _spawn_plan(
        self,
        episode_id: str,
        request: ChatCompletionRequest,
        identity: Identity,
        summary: ContextView,
        agent: str,
    ) -> Plan:
        """A request naming its spawner, of an agent with live contexts: the live context whose head it
        extends (or repeats, when spawned by the same call), else a new SPAWN context."""
        assert identity.spawner is not None
        spawner = spawning_call(summary, identity.spawner, episode_id)
        heads: list[ChatRecord] = []
        for ctx in live_contexts(summary, agent):
            if ctx.head is None or ctx.head in ctx.pending:
                continue  # being opened or generating: another invocation's context
            record = await self._record(episode_id, ctx.head)
            if record is None:
                continue  # never delivered: settled at close
            heads.append(record)
            decision = _try_decide(request, record, identity)
            if decision is None or (decision.move == Move.RETRY and _spawner_of(summary, ctx) != spawner):
                continue  # a repeat of another spawn's request is a new invocation, not a retry
            if self.delivering(episode_id, ctx.head):
                raise self._pending_delivery(episode_id, ctx)
            target = Target(agent, ctx.context_id, ctx, None, fresh_context(summary, agent))
            return Plan(target, identity, decision)
        _check_fresh_spawn(request, heads, await self._summaries(episode_id, summary, agent))
        return Plan(spawn_target(summary, identity, agent), identity, Decision(Move.ROOT, None))

    def _pending_delivery(self, episode_id: str, ctx: ContextSummary) -> ResponsePendingError:
        return ResponsePendingError(
            f"episode {episode_id!r}: call {ctx.head!r}, the head of context {ctx.context_id!r}, has "
            f"completed and its response is still being delivered; retry in "
            f"{ResponsePendingError.retry_after} s "
            "(send the next request of a context after the previous response arrived)",
            episode_id=episode_id,
            context_id=ctx.context_id,
            call_id=ctx.head,
        )

    # ------------------------------------------------------------------------------------ relaunch

    def _replay_lock(self, episode_id: str) -> asyncio.Lock:
        return self._replay_locks.setdefault(episode_id, asyncio.Lock())

    async def _replay(
        self, episode_id: str, request: ChatCompletionRequest, headers: Mapping[str, str], launch: int
    ) -> Delivery | None:
        """A relaunched harness's request answered from a live record of an earlier launch, or None
        (gateway/replay.py): an OpenCode session's, or a program's agent's (no session header)."""
        session = headers.get(opencode.SESSION_HEADER)
        program = program_agent(headers) if session is None else None
        if session is None:
            if program is None:
                return None
            session = program_session(program)
        digest = prompt_digest(request.messages, request.tools)
        ids = await asyncio.to_thread(indexed_calls, self.store, episode_id, digest)
        records = [r for r in [await self._record(episode_id, c) for c in ids] if r is not None]
        records = [r for r in records if r.launch is not None and r.launch < launch]
        if not records:
            return None
        states = await self.episodes.call_states(episode_id, [r.call_id for r in records])
        aliases = await asyncio.to_thread(load_aliases, self.store, episode_id, launch)
        mine, taken = aliases.get(session), claimed_agents(aliases, session)
        child = opencode.PARENT_SESSION_HEADER in headers
        for record in records:
            if states.get(record.call_id) not in LIVE_STATES:
                continue
            agent = replay_agent(record.agent, program, mine, taken, child)
            if agent is None:
                continue
            last = record.call_id if record.agent == agent else (mine.last_replayed if mine else None)
            alias = SessionAlias(agent=agent, last_replayed=last)
            await asyncio.to_thread(save_alias, self.store, episode_id, launch, session, alias)
            log.info("episode %r launch %d: %s answered from %s", episode_id, launch, session, record.call_id)
            return Delivery(self, record, record.call_id, replayed=True)
        return None

    async def _diverge(
        self, episode_id: str, head: ChatRecord, alias: SessionAlias, launch: int
    ) -> tuple[ChatRecord | None, Decision | None]:
        """A relaunched session's first new request: calls of earlier launches after the last one replayed
        to it were never seen by this harness; discard them (newest first) so the request continues what
        it saw. Returns (the head to decide against, None), or (head, a forced REWRITE) when one of them
        cannot be discarded (it spawned a worker or is extended)."""
        current = head
        while current is not None and current.call_id != alias.last_replayed:
            if current.launch is None or current.launch >= launch:
                return current, None  # made by this launch: an ordinary head
            try:
                await self.episodes.discard(
                    episode_id, current.call_id,
                    f"abandoned: launch {launch} of the harness diverged before it (never saw it)",
                )  # fmt: skip
            except EpisodeError as err:
                log.warning("episode %r: %s kept (%s); relaunch rewrites", episode_id, current.call_id, err)
                return current, Decision(Move.REWRITE, current)
            current = await self._record(episode_id, current.extends) if current.extends else None
        return current, None

    async def _head(self, episode_id: str, target: Target, relaunch: bool) -> ChatRecord | None | object:
        """The head's record (None: no head); _REPLAN after discarding an undelivered head."""
        ctx = target.current
        if ctx is None or ctx.head is None:
            return None
        if ctx.head in ctx.pending:
            raise HeadPendingError(
                f"episode {episode_id!r}: call {ctx.head!r}, the head of context {ctx.context_id!r}, "
                "is still generating; send the next request of this context after its response arrived"
            )
        if self.delivering(episode_id, ctx.head):
            raise self._pending_delivery(episode_id, ctx)
        record = await self._record(episode_id, ctx.head)
        # Records are written before responses leave, and a response is recorded delivered before its last
        # part: a head without a record, or still awaiting delivery, that no request of this gateway is
        # delivering never reached anyone (the gateway that made it stopped). A relaunch may still be
        # answered from it (gateway/replay.py): there the head stays.
        if record is not None and (relaunch or ctx.head not in ctx.awaiting_delivery):
            return record
        why = "no chat record" if record is None else "its delivery was never recorded"
        reason = f"response never delivered ({why}: the gateway stopped before answering)"
        await self.episodes.discard(episode_id, ctx.head, reason)
        return _REPLAN

    async def _prepare(
        self,
        episode_id: str,
        request: ChatCompletionRequest,
        plan: Plan,
        sampling: SamplingConfig | None,
        effective: SamplingConfig,
    ) -> CallRequest:
        """Open / discard as the plan says and build the call (its prompt stashed, its id registered as
        delivering); `sampling` is the request's (None: the episode's), `effective` what it samples with."""
        target, decision = plan.target, plan.decision
        base = await self._base(episode_id, decision)
        # Measured before anything is opened, discarded or admitted: a prompt that cannot fit is a 400.
        await self._check_fits(episode_id, target.context_id, request, base, effective)
        context_id, calls = target.context_id, _calls(target)
        if decision.move == Move.ROOT and target.opening is not None:
            await self._open(episode_id, target.opening)
        elif decision.move == Move.RETRY:
            await self.episodes.discard(
                episode_id, decision.head.call_id, "the harness sent the same request again"
            )
        elif decision.move == Move.SKIP_EMPTY:
            await self.episodes.discard(
                episode_id, decision.head.call_id,
                "empty response left out of the harness's next request (EOS-only reply): never trained",
            )  # fmt: skip
        elif decision.move == Move.REWRITE:
            rewrite = ContextRecord(
                context_id=target.rewrite_id,
                agent=target.agent,
                origin=ContextOrigin.REWRITE,
                rewrite_of=target.context_id,
            )
            await self._open(episode_id, rewrite)
            context_id, calls = rewrite.context_id, 0
        call = _call_request(episode_id, f"{context_id}.c{calls}", context_id, request, plan, base, sampling)
        # Claim check: the messages go to the store, the Update carries their key and digest.
        call = await asyncio.to_thread(stash_prompt, self.store, episode_id, call)
        # Delivering from here on: a request of this context that arrives after the ledger completed the
        # call and before its response left must wait, not decide on it.
        self._delivering[(episode_id, call.call_id)] += 1
        return call

    async def _admit(
        self,
        episode_id: str,
        request: ChatCompletionRequest,
        plan: Plan,
        call: CallRequest,
        launch: int | None,
    ) -> Delivery:
        """The call Update (admission, generation), then the chat record, written before any response."""
        try:
            result = await self.episodes.call(episode_id, call)
            # A large completion came by reference (capture/claims.py): read and verified here.
            completion = await asyncio.to_thread(completion_of, self.store, episode_id, result)
            record = _record_of(episode_id, call, result, completion, request, plan, launch)
            await asyncio.to_thread(save_record, self.store, record)
            digest = await asyncio.to_thread(prompt_digest, request.messages, request.tools)
            await asyncio.to_thread(index_call, self.store, episode_id, digest, record.call_id)
        except BaseException:
            self.release(episode_id, call.call_id)
            raise
        return Delivery(self, record, call.call_id)

    async def _base(self, episode_id: str, decision: Decision) -> ChatRecord | None:
        """The call this request's call will extend (None: a root)."""
        if decision.move == Move.CONTINUE:
            return decision.head
        skips = decision.move in (Move.RETRY, Move.SKIP_EMPTY)
        if skips and decision.head.extends is not None:
            return await self._parent(episode_id, decision.head)  # extends what the head extended
        return None

    async def _check_fits(
        self,
        episode_id: str,
        context_id: str,
        request: ChatCompletionRequest,
        base: ChatRecord | None,
        sampling: SamplingConfig,
    ) -> None:
        prompt = _prompt_spec(episode_id, request, base)
        if self.tokens is not None:
            await self.tokens.check(f"{episode_id}/{context_id}", episode_id, prompt, sampling)
        elif self.window is not None:
            await asyncio.to_thread(self.window.check, episode_id, prompt, sampling)

    async def _open(self, episode_id: str, record: ContextRecord) -> None:
        opened = await self.episodes.open_context(episode_id, record)
        if opened != record:  # a concurrent request opened this id with another reservation
            raise ContextConflictError(
                f"episode {episode_id!r}: context {record.context_id!r} was opened concurrently as {opened}, "
                f"not {record}; retry the request"
            )

    async def _head_of(self, episode_id: str, agent: str) -> str | None:
        """The head of the agent's current context (the call that spawns its workers now), or None: asked
        only at a new OpenCode subagent session's first request (gateway/opencode_names.py)."""
        view = await self.episodes.context_view(episode_id, ViewRequest(agents=[agent]))
        ctx = current_context(view, agent)
        return ctx.head if ctx is not None else None

    async def _parent(self, episode_id: str, head: ChatRecord) -> ChatRecord:
        parent = await self._record(episode_id, head.extends)
        if parent is None:
            raise MissingRecordError(
                f"episode {episode_id!r}: call {head.call_id!r} is retried, but the chat record of the "
                f"call it extends ({head.extends!r}) is missing; the retry cannot be spliced onto it"
            )
        return parent


def _try_decide(request: ChatCompletionRequest, head: ChatRecord, identity: Identity) -> Decision | None:
    try:
        return decide(request.messages, request.tools, head, identity.rewrite)
    except UndeclaredDiscontinuityError:
        return None


def _spawner_of(summary: ContextView, ctx: ContextSummary) -> str | None:
    """The call that spawned the context's lineage (a rewrite's spawner is its first context's)."""
    return summary.lineage_spawners.get(ctx.context_id, ctx.spawned_by_call)


def _check_fresh_spawn(
    request: ChatCompletionRequest, heads: list[ChatRecord], summaries: list[ChatRecord]
) -> None:
    """Before a new spawn: a summarised history or a tool-less call of an agent that has tools is a
    wiring mistake (a rewrite or an auxiliary call without its header), not a fresh invocation."""
    if not heads:
        return
    live = [h.context_id for h in heads]
    found = summary_message(request.messages, summaries)
    if found is not None:
        index, source = found
        what = f"it extends none of agent {heads[0].agent!r}'s live contexts {live}"
        err = UndeclaredDiscontinuityError(what, index=index, field="content")
        raise rewrite_error(index, source, err)
    if not request.tools and all(h.tools for h in heads):
        raise UndeclaredAuxiliaryCallError(
            f"the request names its spawner ({SPAWNED_BY_HEADER} / {PARENT_CONTEXT_HEADER}) but has no "
            f"tools while agent {heads[0].agent!r}'s contexts {live} have them: it looks like an auxiliary "
            "call (a summary or title call), not a new invocation of the worker. Send it with the header "
            f"`{KIND_HEADER}: auxiliary` (a context of its own, never trained)",
            index=None,
            field="tools",
        )


def _check_unspawned(spec: EpisodeSpec, summary: ContextView, identity: Identity, target: Target) -> None:
    """Strict episodes refuse a new agent that names no spawner while another agent is the root."""
    opening = target.opening
    if (
        spec.unspawned_agents != "refuse"
        or opening is None
        or opening.origin != ContextOrigin.ROOT
        or identity.kind != CallKind.ACTION
        or AUX_SEPARATOR in target.agent
    ):
        return
    roots = sorted(summary.root_agents)  # the view leaves out auxiliary agents (`~`)
    if roots:
        raise UnspawnedAgentError(
            f"episode {summary.episode_id!r}: agent {target.agent!r} is new and names no spawner, and the "
            f"episode already has the root agent(s) {roots}; this episode refuses unspawned agents "
            "(EpisodeSpec.unspawned_agents='refuse'). Send the worker's requests with the header "
            f"`{SPAWNED_BY_HEADER}: <the x-grove-call-id of the response that started it>` (or "
            f"`{PARENT_CONTEXT_HEADER}: <that response's x-grove-context>`)"
        )


def _calls(target: Target) -> int:
    return 0 if target.current is None else sum(target.current.counts.values())


def _check_session(episode_id: str, identity: Identity, head: ChatRecord | None) -> None:
    if identity.root_session and head is not None and head.session_id not in (None, identity.session_id):
        raise ForeignSessionError(
            f"episode {episode_id!r}: OpenCode session {identity.session_id!r} has no parent session, but "
            f"the episode's parent agent runs in session {head.session_id!r}; one episode serves one "
            "OpenCode run"
        )


def _prompt_spec(episode_id: str, request: ChatCompletionRequest, base: ChatRecord | None) -> PromptSpec:
    chat = ChatPrompt(
        messages=request.messages,
        tools=request.tools,
        parent_messages=base.messages if base else None,
        parent_response=base.response if base else None,  # what the harness got: nothing re-parsed
    )
    return PromptSpec(
        chat=chat,
        parent_call_id=base.call_id if base else None,
        parent_staging_key=staging_key(episode_id, base.call_id) if base else None,
    )


def _call_request(
    episode_id: str,
    call_id: str,
    context_id: str,
    request: ChatCompletionRequest,
    plan: Plan,
    base: ChatRecord | None,
    sampling: SamplingConfig | None,
) -> CallRequest:
    prompt = _prompt_spec(episode_id, request, base)
    return CallRequest(
        call_id=call_id,
        context_id=context_id,
        kind=plan.identity.kind,
        extends=base.call_id if base else None,
        prompt=prompt,
        sampling=sampling,
        completion_by_ref=True,  # _admit reads it with completion_of
        await_delivery=True,  # trained only once the route records its delivery (gateway/delivery.py)
    )


def _record_of(
    episode_id: str,
    call: CallRequest,
    result: CallResult,
    completion: Completion,
    request: ChatCompletionRequest,
    plan: Plan,
    launch: int | None,
) -> ChatRecord:
    return ChatRecord(
        episode_id=episode_id,
        call_id=result.call_id,  # a retry after a lost attempt completes under its own id
        context_id=call.context_id,
        agent=plan.target.agent,
        kind=call.kind,
        extends=call.extends,
        messages=request.messages,
        tools=request.tools,
        response=completion.assistant_message,
        finish_reason=result.finish_reason,
        usage=Usage(prompt_tokens=result.digests.prompt_len, completion_tokens=result.digests.completion_len),
        policy_version=result.policy_version,
        session_id=plan.identity.session_id,
        launch=launch,
    )


def _session_of(identity: Identity) -> str:
    """The alias key of a relaunched request's session: OpenCode's session id, else the program's agent
    as named (gateway/replay.py)."""
    if identity.session_id is not None:
        return identity.session_id
    return program_session(identity.agent) if identity.agent is not None else ""


def request_gate_key(
    episode_id: str, launch: int | None, headers: Mapping[str, str], request: ChatCompletionRequest
) -> str:
    """Key of the `chat_request` test gate: `{episode}/{launch or 0}/{x-grove-agent or -}/{n messages}`."""
    return f"{episode_id}/{launch or 0}/{headers.get(AGENT_HEADER, '-')}/{len(request.messages)}"
