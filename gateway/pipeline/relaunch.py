"""A relaunched harness inside the capture path: its requests answered from an earlier launch's records,
and its sessions' first new requests cut loose from what that launch made after them.

The store side (prompt index, session aliases, which agent a request may be replayed as) is
gateway/pipeline/launch_records.py, which also explains the whole rule; this module holds the two steps
that need the ledger, `Relaunch.replay` (answer from a live record of an earlier launch) and
`Relaunch.diverge` (discard the calls of earlier launches the relaunched session never saw).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from capture.records import ChatRecord
from gateway.intake.capture_request import CaptureRequest
from gateway.pipeline import codex, opencode
from gateway.pipeline.capture_state import CaptureState
from gateway.pipeline.continuation import Decision, Move
from gateway.pipeline.delivery import Delivery
from gateway.pipeline.identity import Identity
from gateway.pipeline.launch_records import (
    SessionAlias,
    claimed_agents,
    indexed_calls,
    load_aliases,
    program_agent,
    program_session,
    prompt_digest,
    replay_agent,
    save_alias,
)
from gateway.pipeline.opencode_names import opencode_sessions
from gateway.temporal.episode_client import EpisodeError
from grove.headers import AGENT_HEADER, CONTEXT_HEADER

log = logging.getLogger("grove.gateway")

LIVE_STATES = frozenset({"completed", "selected", "auxiliary"})  # calls a relaunch may be answered from


class Relaunch:
    """Answers a relaunched harness from earlier launches' records, and cuts its sessions loose (module
    docstring); one replay at a time per episode (its claims of session aliases must not interleave)."""

    def __init__(self, state: CaptureState) -> None:
        self.state = state
        self._locks: dict[str, asyncio.Lock] = {}  # episode -> its replay lock

    def lock(self, episode_id: str) -> asyncio.Lock:
        return self._locks.setdefault(episode_id, asyncio.Lock())

    async def replay(
        self,
        episode_id: str,
        request: CaptureRequest,
        headers: Mapping[str, str],
        launch: int,
    ) -> Delivery | None:
        """A relaunched harness's request answered from a live record of an earlier launch, or None
        (gateway/pipeline/launch_records.py): an OpenCode session's or a Codex thread's (its parent
        session or thread makes it a child), or a program's agent's (neither)."""
        sessions = opencode_sessions(headers)
        program = program_agent(headers) if sessions is None else None
        if sessions is not None:
            session, child = sessions[0], sessions[1] is not None
        elif program is not None and not _unreadable_session(headers):
            session, child = program_session(program), False
        else:
            return None  # nothing to replay as, or headers the planner refuses
        digest = prompt_digest(request.messages, request.tools)
        ids = await asyncio.to_thread(indexed_calls, self.state.store, episode_id, digest)
        records = [r for r in [await self.state.record(episode_id, c) for c in ids] if r is not None]
        records = [r for r in records if r.launch is not None and r.launch < launch]
        if not records:
            return None
        states = await self.state.episodes.call_states(episode_id, [r.call_id for r in records])
        aliases = await asyncio.to_thread(load_aliases, self.state.store, episode_id, launch)
        mine, taken = aliases.get(session), claimed_agents(aliases, session)
        for record in records:
            if states.get(record.call_id) not in LIVE_STATES:
                continue
            agent = replay_agent(record.agent, program, mine, taken, child)
            if agent is None:
                continue
            last = record.call_id if record.agent == agent else (mine.last_replayed if mine else None)
            alias = SessionAlias(agent=agent, last_replayed=last)
            await asyncio.to_thread(save_alias, self.state.store, episode_id, launch, session, alias)
            log.info("episode %r launch %d: %s answered from %s", episode_id, launch, session, record.call_id)
            return Delivery(self.state, record, record.call_id, replayed=True)
        return None

    async def diverge(
        self, episode_id: str, head: ChatRecord, alias: SessionAlias, launch: int
    ) -> tuple[ChatRecord | None, Decision | None]:
        """A relaunched session's first new request: calls of earlier launches after the last one replayed
        to it were never seen by this harness; discard them (newest first) so the request continues what
        it saw. Returns (the head to decide against, None), or (head, a forced REWRITE) when one of them
        cannot be discarded (it spawned a worker or is extended)."""
        current: ChatRecord | None = head
        while current is not None and current.call_id != alias.last_replayed:
            if current.launch is None or current.launch >= launch:
                return current, None  # made by this launch: an ordinary head
            try:
                await self.state.episodes.discard(
                    episode_id, current.call_id,
                    f"abandoned: launch {launch} of the harness diverged before it (never saw it)",
                )  # fmt: skip
            except EpisodeError as err:
                log.warning("episode %r: %s kept (%s); relaunch rewrites", episode_id, current.call_id, err)
                return current, Decision(Move.REWRITE, current)
            current = await self.state.record(episode_id, current.extends) if current.extends else None
        return current, None


def _unreadable_session(headers: Mapping[str, str]) -> bool:
    """An OpenCode session or Codex thread header that `opencode_sessions` could not read (and grove's own
    agent/context headers do not override): the request is refused when planned, never replayed."""
    harness = opencode.SESSION_HEADER in headers or codex.TURN_METADATA_HEADER in headers
    return harness and AGENT_HEADER not in headers and CONTEXT_HEADER not in headers


def session_of(identity: Identity) -> str:
    """The alias key of a relaunched request's session: OpenCode's session id, else the program's agent
    as named (gateway/pipeline/launch_records.py)."""
    if identity.session_id is not None:
        return identity.session_id
    return program_session(identity.agent) if identity.agent is not None else ""
