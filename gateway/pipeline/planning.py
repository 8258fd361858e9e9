"""Planning one chat request: which context it goes to and how it relates to that context's head.

    view      -> the `context_view` of the agents the headers may name (gateway/pipeline/routing.py
                 view_request; ledger/context_view.py): what routing needs, never the whole summary
              -> identity (headers) -> target context (gateway/pipeline/routing.py); a new agent without a
                 spawner is refused or accepted as the episode's spec says (gateway/pipeline/spawn_checks.py);
                 another agent's context is refused (403 ContextOwnershipError)
    spawn     -> a request that names its spawner (identity.respawn) goes to the live context of its
                 agent that it extends or repeats, else opens a new SPAWN context (a worker invoked
                 again with a fresh history); contexts still generating are never candidates
    head      -> still generating: 409 HeadPendingError; still being delivered by a request of this
                 gateway, its last part not sent: 409 ResponsePendingError (Retry-After); else its chat
                 record (a completed head without one, or awaiting delivery in the ledger, that no
                 request of this gateway sent, was never delivered: discard it, redo)
    decision  -> ROOT / CONTINUE / RETRY / SKIP_EMPTY / REWRITE or 400 (gateway/pipeline/continuation.py);
    nothing is
                 admitted for a refused request, and the error names the header that fixes the common
                 mistakes (gateway/pipeline/hints.py)

A relaunched harness's session first drops what its earlier launch made after the last call replayed to it
(gateway/pipeline/relaunch.py `Relaunch.diverge`). Nothing is opened or admitted here: `Planner.plan`
returns a `Plan`, and gateway/pipeline/execution.py acts on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Literal

from capture.records import ChatRecord
from gateway.intake.capture_request import CaptureRequest
from gateway.pipeline.capture_errors import (
    EpisodeClosedError,
    ForeignSessionError,
    HeadPendingError,
    ResponsePendingError,
)
from gateway.pipeline.capture_state import CaptureState
from gateway.pipeline.continuation import Decision, Move, UndeclaredDiscontinuityError, decide
from gateway.pipeline.hints import diagnose
from gateway.pipeline.identity import DEFAULT_AGENT, Identity, aux_agent
from gateway.pipeline.launch_records import SessionAlias, load_aliases, save_alias
from gateway.pipeline.opencode_names import session_names
from gateway.pipeline.relaunch import Relaunch, session_of
from gateway.pipeline.routing import (
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
from gateway.pipeline.spawn_checks import check_fresh_spawn, check_unspawned, spawner_of, try_decide
from grove.contracts import EpisodeSpec
from ledger.accounting import ContextSummary
from ledger.context_view import ContextView, ViewRequest


class _Replan(Enum):
    REPLAN = "replan"  # _head's answer after discarding an undelivered head


_REPLAN = _Replan.REPLAN


@dataclass(frozen=True)
class Plan:
    target: Target
    identity: Identity
    decision: Decision


class Planner:
    """Plans requests against the episode's ledger (module docstring), through the capture's shared
    `state`; a relaunched session's first request diverges through `relaunch`."""

    def __init__(self, state: CaptureState, relaunch: Relaunch) -> None:
        self.state, self.relaunch = state, relaunch

    async def plan(
        self,
        episode_id: str,
        request: CaptureRequest,
        headers: Mapping[str, str],
        launch: int | None,
        spec: EpisodeSpec,
    ) -> Plan | None:
        """The plan for this request; None after discarding an undelivered head (plan again)."""
        relaunched = launch if launch is not None and launch > 1 else None  # this launch, when a relaunch
        aliases: dict[str, SessionAlias] = {}
        if relaunched is not None:
            aliases = await asyncio.to_thread(load_aliases, self.state.store, episode_id, relaunched)
        # OpenCode's subagents by their agent type (gateway/pipeline/opencode_names.py)
        names = await session_names(
            self.state.store, episode_id, headers, request.messages,
            lambda agent: self.head_of(episode_id, agent),
            lambda call_id: self.state.record(episode_id, call_id),
            {s: a.agent for s, a in aliases.items()},
        )  # fmt: skip
        view = await self.state.episodes.context_view(episode_id, view_request(headers, names))
        if view.closed or view.closing:
            raise EpisodeClosedError(
                f"episode {episode_id!r} is closed (its ledger is settled); no more calls. Start a new "
                "episode for a new attempt"
            )
        identity = identify(headers, request.messages, request.tools, view, names)
        if relaunched is not None and identity.root_session and identity.session_id:
            # A relaunch's root session is the episode's parent, even where nothing could be replayed.
            root_alias = SessionAlias(agent=identity.agent or DEFAULT_AGENT)
            await asyncio.to_thread(
                save_alias, self.state.store, episode_id, relaunched, identity.session_id, root_alias
            )
            aliases[identity.session_id] = root_alias
            identity = replace(identity, root_session=False)
        target = route(view, identity)
        if identity.respawn and identity.context_id is None and target.current is not None:
            return await self._spawn_plan(episode_id, request, identity, view, target.agent)
        check_unspawned(spec, view, identity, target)
        head = await self._head(episode_id, target, relaunched is not None)
        if head is _REPLAN:
            return None
        alias = aliases.get(session_of(identity))
        if relaunched is not None and alias is not None and head is not None:
            head, forced = await self.relaunch.diverge(episode_id, head, alias, relaunched)
            if forced is not None:
                return Plan(target, identity, forced)
        _check_session(episode_id, identity, head)
        try:
            decision = decide(request.messages, request.tools, head, identity.rewrite)
        except UndeclaredDiscontinuityError as err:
            if head is None:  # decide starts a root without a head: it raises only against one
                raise
            summaries = await self._summaries(episode_id, view, target.agent)
            raise diagnose(err, request.messages, request.tools, identity, head, summaries) from None
        return Plan(target, identity, decision)

    async def _summaries(self, episode_id: str, summary: ContextView, agent: str) -> list[ChatRecord]:
        """The records of the heads of the agent's auxiliary contexts (its possible summary calls)."""
        records = []
        for purpose in ("aux", "summary"):
            ctx = current_context(summary, aux_agent(agent, purpose))
            if ctx is not None and ctx.head is not None and ctx.head not in ctx.pending:
                record = await self.state.record(episode_id, ctx.head)
                if record is not None:
                    records.append(record)
        return records

    async def _spawn_plan(
        self,
        episode_id: str,
        request: CaptureRequest,
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
            record = await self.state.record(episode_id, ctx.head)
            if record is None:
                continue  # never delivered: settled at close
            heads.append(record)
            decision = try_decide(request, record, identity)
            if decision is None or (decision.move == Move.RETRY and spawner_of(summary, ctx) != spawner):
                continue  # a repeat of another spawn's request is a new invocation, not a retry
            if self.state.delivering(episode_id, ctx.head):
                raise _pending_delivery(episode_id, ctx, ctx.head)
            target = Target(agent, ctx.context_id, ctx, None, fresh_context(summary, agent))
            return Plan(target, identity, decision)
        check_fresh_spawn(request, heads, await self._summaries(episode_id, summary, agent))
        return Plan(spawn_target(summary, identity, agent), identity, Decision(Move.ROOT, None))

    async def _head(
        self, episode_id: str, target: Target, relaunch: bool
    ) -> ChatRecord | None | Literal[_Replan.REPLAN]:
        """The head's record (None: no head); _REPLAN after discarding an undelivered head."""
        ctx = target.current
        if ctx is None or ctx.head is None:
            return None
        if ctx.head in ctx.pending:
            raise HeadPendingError(
                f"episode {episode_id!r}: call {ctx.head!r}, the head of context {ctx.context_id!r}, "
                "is still generating; send the next request of this context after its response arrived"
            )
        if self.state.delivering(episode_id, ctx.head):
            raise _pending_delivery(episode_id, ctx, ctx.head)
        record = await self.state.record(episode_id, ctx.head)
        # Records are written before responses leave, and a response's delivery is recorded right after its
        # last part: a head this gateway sent is the harness's (its `deliver` on its way; extending it counts
        # it delivered). A head without a record, or still awaiting delivery, that no request of this gateway
        # sent or is delivering did not reach the harness as far as anyone can tell (the gateway that made it
        # stopped): discarded, never trained. A relaunch may still be answered from it
        # (gateway/pipeline/launch_records.py): there the head stays.
        sent = self.state.sent(episode_id, ctx.head)
        if record is not None and (relaunch or sent or ctx.head not in ctx.awaiting_delivery):
            return record
        why = "no chat record" if record is None else "its delivery was never recorded"
        reason = f"response never delivered ({why}: the gateway stopped before answering)"
        await self.state.episodes.discard(episode_id, ctx.head, reason)
        return _REPLAN

    async def head_of(self, episode_id: str, agent: str) -> str | None:
        """The head of the agent's current context (the call that spawns its workers now), or None: asked
        only at a new OpenCode subagent session's first request (gateway/pipeline/opencode_names.py)."""
        view = await self.state.episodes.context_view(episode_id, ViewRequest(agents=[agent]))
        ctx = current_context(view, agent)
        return ctx.head if ctx is not None else None


def _pending_delivery(episode_id: str, ctx: ContextSummary, head: str) -> ResponsePendingError:
    return ResponsePendingError(
        f"episode {episode_id!r}: call {head!r}, the head of context {ctx.context_id!r}, has "
        f"completed and its response is still being delivered; retry in "
        f"{ResponsePendingError.retry_after} s "
        "(send the next request of a context after the previous response arrived)",
        episode_id=episode_id,
        context_id=ctx.context_id,
        call_id=head,
    )


def _check_session(episode_id: str, identity: Identity, head: ChatRecord | None) -> None:
    if identity.root_session and head is not None and head.session_id not in (None, identity.session_id):
        raise ForeignSessionError(
            f"episode {episode_id!r}: OpenCode session {identity.session_id!r} has no parent session, but "
            f"the episode's parent agent runs in session {head.session_id!r}; one episode serves one "
            "OpenCode run"
        )
