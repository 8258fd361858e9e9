"""Which context a chat request goes to, and which context must be opened first (pure).

From the request's headers (gateway/pipeline/identity.py, gateway/pipeline/opencode.py,
gateway/pipeline/codex.py) and the episode's
`context_view` (ledger/context_view.py: the contexts of the few agents a request may involve, whatever the
episode's size; `view_request` names them): the agent's current context (the most recent one no rewrite
retired), an explicitly named context, or a new one — ROOT for an agent nobody spawned, SPAWN when the headers
name the spawning call (directly, or as the head of a context or of an agent's current context). New context
ids follow the native harness's convention `{agent}.{n}` (n = the agent's number of contexts, skipping ids the
agent named itself), so they are deterministic.

Context ids belong to agents: `{agent}.{...}` is agent's name space (agent names have no '.'). A request
may open, continue or rewrite only contexts of its own agent; naming another agent's context
(`x-grove-context: parent.1` from agent `squat`) is `ContextOwnershipError` (HTTP 403) before anything
is opened, so no agent can take an id another agent's rewrite will need. A request that names a new
context without naming its agent is that context's agent's.

An agent spawned several times (a worker invoked again with a fresh history) has several *live*
contexts (none retired); `live_contexts` lists them and `spawn_target` opens the next one
(gateway/pipeline/planning.py chooses among them by the request's messages).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.pipeline import claude_code, codex, opencode
from gateway.pipeline.identity import (
    AUX_SEPARATOR,
    DEFAULT_AGENT,
    ID_PATTERN,
    Identity,
    RewriteMode,
    Spawner,
    agent_header,
    aux_agent,
    grove_identity,
    header_value,
)
from gateway.pipeline.opencode_names import SubagentName
from grove.headers import AGENT_HEADER, CONTEXT_HEADER, PARENT_CONTEXT_HEADER
from grove.receipts import ContextOrigin, ContextRecord
from ledger.accounting import ContextSummary
from ledger.context_view import ContextView, ViewRequest

AUX_PURPOSES = ("aux", "summary", "title")  # gateway/pipeline/identity.py, gateway/pipeline/opencode.py


class RoutingError(ValueError):
    """Headers that name contexts or spawners the episode's ledger does not have (HTTP 400)."""


class ContextOwnershipError(RoutingError):
    """A request that names a context of another agent's name space (HTTP 403)."""

    def __init__(self, message: str, *, agent: str, context_id: str, owner: str) -> None:
        super().__init__(message)
        self.agent, self.context_id, self.owner = agent, context_id, owner


@dataclass(frozen=True)
class Target:
    agent: str
    context_id: str  # the context the call goes to (unless the decision is a rewrite)
    current: ContextSummary | None  # the context as the ledger has it; None: open `opening` first
    opening: ContextRecord | None  # ROOT / SPAWN reservation for an agent's first context
    rewrite_id: str  # the id a rewrite of `current` gets


def view_request(headers: Mapping[str, str], aliases: Mapping[str, str] | None = None) -> ViewRequest:
    """Every agent and context a request with these headers may route to, spawn from or compare with: its
    agent (grove's header, OpenCode's session and parent session, the default agent, a relaunch's
    aliases) with their auxiliary agents, and the contexts its headers name. A superset: what routing
    then finds in the view is exactly what it would find in the whole summary."""
    agents = {DEFAULT_AGENT, *(aliases or {}).values()}
    named = agent_header(headers)
    if named is not None:
        agents.add(named)
    for name in (opencode.SESSION_HEADER, opencode.PARENT_SESSION_HEADER):
        session = header_value(headers, name, opencode.SESSION_PATTERN)
        if session is not None:
            agents.add(opencode.worker_agent(session))
    for thread in codex.threads(headers) or ():
        if thread is not None:
            agents.add(opencode.worker_agent(thread))
    contexts = [
        c
        for c in (header_value(headers, h, ID_PATTERN) for h in (CONTEXT_HEADER, PARENT_CONTEXT_HEADER))
        if c
    ]
    agents |= {owner_of(c) for c in contexts}
    agents |= {aux_agent(a, p) for a in list(agents) for p in AUX_PURPOSES}
    return ViewRequest(agents=sorted(agents), contexts=contexts, root_exclude=AUX_SEPARATOR)


def owner_of(context_id: str) -> str:
    """The agent whose name space a context id is in: its first '.'-separated part."""
    return context_id.split(".", 1)[0]


def identify(
    headers: Mapping[str, str],
    messages: Sequence[dict[str, Any]],
    tools: Any,
    summary: ContextView,
    aliases: Mapping[str, str] | None = None,
    claude: SubagentName | None = None,
) -> Identity:
    """grove's headers when an agent/context header is present, else OpenCode's session headers when
    present (`aliases`: sessions or threads of a relaunched harness -> the recorded agents they replay,
    or subagents' names), else Codex's turn metadata when present, else Claude Code's (`claude`: the
    request's subagent's stored name, gateway/pipeline/claude_code.py), else the default identity (agent
    "parent")."""
    has_grove = any(h in headers for h in (AGENT_HEADER, CONTEXT_HEADER))
    if not has_grove and opencode.SESSION_HEADER in headers:
        return opencode.identify(headers, messages, tools, {c.agent for c in summary.contexts}, aliases)
    if not has_grove and codex.TURN_METADATA_HEADER in headers:
        return codex.identify(headers, messages, tools, {c.agent for c in summary.contexts}, aliases)
    if not has_grove and claude_code.is_claude_code(headers):
        return claude_code.identify(headers, messages, claude)
    return grove_identity(headers)


def live_contexts(summary: ContextView, agent: str) -> list[ContextSummary]:
    """The agent's contexts that no rewrite retired, most recently opened first."""
    return [c for c in reversed(summary.contexts) if c.agent == agent and c.retired_by is None]


def current_context(summary: ContextView, agent: str) -> ContextSummary | None:
    """The agent's most recently opened live context (its only one unless it was spawned again)."""
    return next(iter(live_contexts(summary, agent)), None)


def fresh_context(summary: ContextView, agent: str) -> str:
    """The id the agent's next context gets (the view's first free `{agent}.{n}`)."""
    return summary.next_context.get(agent, f"{agent}.0")


def spawn_target(summary: ContextView, identity: Identity, agent: str) -> Target:
    """A new SPAWN context `{agent}.{n}` for a request that names its spawner (identity.respawn)."""
    assert identity.spawner is not None
    fresh = fresh_context(summary, agent)
    return Target(agent, fresh, None, _opening(summary, identity, agent, fresh), fresh)


def spawning_call(summary: ContextView, spawner: Spawner, episode_id: str) -> str:
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
            f"spawning agent made before it (contexts: {[c.context_id for c in summary.contexts]})"
        )
    return ctx.head


def _opening(summary: ContextView, identity: Identity, agent: str, context_id: str) -> ContextRecord:
    if identity.spawner is None:
        return ContextRecord(context_id=context_id, agent=agent, origin=ContextOrigin.ROOT)
    spawned_by = spawning_call(summary, identity.spawner, summary.episode_id)
    return ContextRecord(
        context_id=context_id, agent=agent, origin=ContextOrigin.SPAWN, spawned_by_call=spawned_by
    )


def route(summary: ContextView, identity: Identity) -> Target:
    """The target context of a request with this identity (RoutingError for impossible headers,
    ContextOwnershipError for another agent's context)."""
    by_id = {c.context_id: c for c in summary.contexts}
    named = by_id.get(identity.context_id) if identity.context_id else None
    if identity.context_id is not None:
        _check_owner(summary, identity, named)
    current: ContextSummary | None
    if named is not None:
        agent, current = named.agent, named
    else:
        agent = identity.agent or (owner_of(identity.context_id) if identity.context_id else DEFAULT_AGENT)
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
    fresh = identity.context_id if identity.context_id and named is None else fresh_context(summary, agent)
    if current is None:
        return Target(agent, fresh, None, _opening(summary, identity, agent, fresh), fresh)
    return Target(agent, current.context_id, current, None, fresh)


def _check_owner(summary: ContextView, identity: Identity, named: ContextSummary | None) -> None:
    """A named context must be the requesting agent's: an existing one opened by it, a new one in its name
    space (`{agent}.{...}`)."""
    assert identity.context_id is not None
    owner = named.agent if named is not None else owner_of(identity.context_id)
    agent = identity.agent or owner
    if agent == owner:
        return
    what = "belongs to" if named is not None else "is in the name space of"
    raise ContextOwnershipError(
        f"episode {summary.episode_id!r}: agent {agent!r} may not open, continue or rewrite context "
        f"{identity.context_id!r}: it {what} agent {owner!r} (context ids are `<agent>.<n>`, the agent's). "
        f"Send the agent's own context id ({agent}.<n>) or no {CONTEXT_HEADER} header (the agent's current "
        "context)",
        agent=agent,
        context_id=identity.context_id,
        owner=owner,
    )
