"""Which context a chat request goes to, and which context must be opened first (pure).

From the request's headers (gateway/identity.py, gateway/opencode.py) and the episode's ledger
summary: the agent's current context (the most recent one no rewrite retired), an explicitly named
context, or a new one — ROOT for an agent nobody spawned, SPAWN when the headers name the spawning call
(directly, or as the head of a context or of an agent's current context). New context ids follow the
native harness's convention `{agent}.{n}` (n = the agent's number of contexts), so they are
deterministic.

An agent spawned several times (a worker invoked again with a fresh history) has several *live*
contexts (none retired); `live_contexts` lists them and `spawn_target` opens the next one
(gateway/capture.py chooses among them by the request's messages).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import opencode
from gateway.identity import (
    AGENT_HEADER,
    CONTEXT_HEADER,
    DEFAULT_AGENT,
    Identity,
    RewriteMode,
    Spawner,
    grove_identity,
)
from grove.receipts import ContextOrigin, ContextRecord
from workflows.accounting import ContextSummary, LedgerSummary


class RoutingError(ValueError):
    """Headers that name contexts or spawners the episode's ledger does not have (HTTP 400)."""


@dataclass(frozen=True)
class Target:
    agent: str
    context_id: str  # the context the call goes to (unless the decision is a rewrite)
    current: ContextSummary | None  # the context as the ledger has it; None: open `opening` first
    opening: ContextRecord | None  # ROOT / SPAWN reservation for an agent's first context
    rewrite_id: str  # the id a rewrite of `current` gets


def identify(
    headers: Mapping[str, str],
    messages: Sequence[dict[str, Any]],
    tools: Any,
    summary: LedgerSummary,
    aliases: Mapping[str, str] | None = None,
) -> Identity:
    """grove's headers when an agent/context header is present, else OpenCode's session headers when
    present (`aliases`: sessions of a relaunched harness -> the recorded agents they replay), else the
    default identity (agent "parent")."""
    has_grove = any(h in headers for h in (AGENT_HEADER, CONTEXT_HEADER))
    if not has_grove and opencode.SESSION_HEADER in headers:
        return opencode.identify(headers, messages, tools, {c.agent for c in summary.contexts}, aliases)
    return grove_identity(headers)


def live_contexts(summary: LedgerSummary, agent: str) -> list[ContextSummary]:
    """The agent's contexts that no rewrite retired, most recently opened first."""
    return [c for c in reversed(summary.contexts) if c.agent == agent and c.retired_by is None]


def current_context(summary: LedgerSummary, agent: str) -> ContextSummary | None:
    """The agent's most recently opened live context (its only one unless it was spawned again)."""
    return next(iter(live_contexts(summary, agent)), None)


def spawn_target(summary: LedgerSummary, identity: Identity, agent: str) -> Target:
    """A new SPAWN context `{agent}.{n}` for a request that names its spawner (identity.respawn)."""
    assert identity.spawner is not None
    fresh = f"{agent}.{sum(c.agent == agent for c in summary.contexts)}"
    return Target(agent, fresh, None, _opening(summary, identity, agent, fresh), fresh)


def spawning_call(summary: LedgerSummary, spawner: Spawner, episode_id: str) -> str:
    if spawner.call_id is not None:
        return spawner.call_id
    if spawner.context_id is not None:
        ctx = next((c for c in summary.contexts if c.context_id == spawner.context_id), None)
        what = f"context {spawner.context_id!r}"
    else:
        ctx = current_context(summary, spawner.agent or DEFAULT_AGENT)
        what = f"agent {spawner.agent!r}'s current context"
    if ctx is None or ctx.head is None:
        raise RoutingError(
            f"episode {episode_id!r}: the spawner of a new worker is {what}, which "
            f"{'does not exist' if ctx is None else 'has no call'}; a worker is spawned by a call the "
            f"spawning agent made before it (known contexts: {[c.context_id for c in summary.contexts]})"
        )
    return ctx.head


def _opening(summary: LedgerSummary, identity: Identity, agent: str, context_id: str) -> ContextRecord:
    if identity.spawner is None:
        return ContextRecord(context_id=context_id, agent=agent, origin=ContextOrigin.ROOT)
    spawned_by = spawning_call(summary, identity.spawner, summary.episode_id)
    return ContextRecord(
        context_id=context_id, agent=agent, origin=ContextOrigin.SPAWN, spawned_by_call=spawned_by
    )


def route(summary: LedgerSummary, identity: Identity) -> Target:
    """The target context of a request with this identity (RoutingError for impossible headers)."""
    by_id = {c.context_id: c for c in summary.contexts}
    named = by_id.get(identity.context_id) if identity.context_id else None
    if named is not None:
        if identity.agent is not None and named.agent != identity.agent:
            raise RoutingError(
                f"episode {summary.episode_id!r}: context {named.context_id!r} belongs to agent "
                f"{named.agent!r}, not {identity.agent!r}; send the agent's own context id or no context "
                "header"
            )
        agent, current = named.agent, named
    else:
        agent = identity.agent or DEFAULT_AGENT
        current = current_context(summary, agent)
        if (
            current is not None
            and identity.context_id is not None
            and identity.rewrite != RewriteMode.DECLARED
        ):
            raise RoutingError(
                f"episode {summary.episode_id!r}: context {identity.context_id!r} does not exist and agent "
                f"{agent!r} already has the current context {current.context_id!r}; a new context of the "
                "same agent must be a declared rewrite (x-grove-rewrite: 1)"
            )
    n = sum(c.agent == agent for c in summary.contexts)
    fresh = identity.context_id if identity.context_id and named is None else f"{agent}.{n}"
    if current is None:
        return Target(agent, fresh, None, _opening(summary, identity, agent, fresh), fresh)
    return Target(agent, current.context_id, current, None, fresh)
