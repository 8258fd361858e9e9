"""What one gateway request needs to know of the ledger: the contexts of the agents it may route to (pure).

A chat request asks the `context_view` query, never the whole `summary` (one entry per context of the episode:
a cost per request that grows with the episode). The view answers the routing questions for the few agents and
contexts a request names (`ViewRequest`, built from its headers by gateway/pipeline/routing.py), in a payload
whose size does not depend on the episode's:

- the live (not retired) contexts of those agents and every named context, with head, pending calls and
  calls awaiting delivery (`ContextSummary`);
- per agent: how many contexts it opened, and the id its next context gets (`{agent}.{n}`, the first
  free n: an id the agent named itself is skipped);
- the first root agents of the episode (agents opened as ROOT, at most two: enough to tell whether a new
  root is the first);
- per returned context, the call that spawned its lineage (a rewrite's spawner is its first context's);
- whether the ledger is closed, or a close was accepted (`closing`).

The workflow answers from its index of contexts by agent (`Ledger.contexts_of`) and never scans the
episode's contexts (the first root agents are found at the start of the opening order); what crosses
Temporal and what the gateway decodes is bounded by the request's own agents.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from itertools import islice

from pydantic import BaseModel, Field

from ledger.accounting import LedgerSummary
from ledger.ledger import Ledger

MAX_ROOT_AGENTS = 2


class ViewRequest(BaseModel):
    """The agents and context ids one request may involve (its own, its auxiliary agents, its spawner)."""

    agents: list[str] = Field(default_factory=list)
    contexts: list[str] = Field(default_factory=list)
    root_exclude: str = ""  # root agents whose name holds this are not counted (the gateway's `~` agents)


class ContextView(LedgerSummary):
    """A `LedgerSummary` holding only the request's contexts (no totals, no warnings), plus what routing
    needs beyond them."""

    closing: bool = False  # a close was accepted: nothing more is admitted or delivered
    context_counts: dict[str, int] = Field(default_factory=dict)  # agent -> contexts it opened
    next_context: dict[str, str] = Field(default_factory=dict)  # agent -> the id its next context gets
    root_agents: list[str] = Field(default_factory=list)  # the episode's first root agents (at most 2)
    lineage_spawners: dict[str, str | None] = Field(default_factory=dict)  # context -> its lineage's spawner


def context_view(ledger: Ledger, req: ViewRequest, *, closing: bool) -> ContextView:
    """The view of `req`'s agents and contexts (module docstring)."""
    named = {c for c in req.contexts if c in ledger.contexts}
    agents = sorted(set(req.agents) | {ledger.contexts[c].record.agent for c in named})
    counts = {agent: len(ledger.contexts_of(agent)) for agent in agents}
    chosen = [
        context_id
        for agent in agents
        for context_id in ledger.contexts_of(agent)
        if ledger.contexts[context_id].retired_by is None or context_id in named
    ]
    return ContextView(
        episode_id=ledger.episode_id,
        group_id=ledger.group_id,
        closed=ledger.closed,
        closing=closing,
        totals={},
        contexts=[ledger.context_summary(c) for c in chosen],
        context_counts=counts,
        next_context={agent: _next_context(ledger, agent, n) for agent, n in counts.items()},
        root_agents=_root_agents(ledger, req.root_exclude),
        lineage_spawners={c: _lineage_spawner(ledger, c) for c in chosen},
    )


def _next_context(ledger: Ledger, agent: str, opened: int) -> str:
    n = opened
    while f"{agent}.{n}" in ledger.contexts:
        n += 1
    return f"{agent}.{n}"


def _root_agents(ledger: Ledger, exclude: str) -> list[str]:
    agents = (a for a in ledger.agents_opened_as_roots() if not (exclude and exclude in a))
    return list(islice(agents, MAX_ROOT_AGENTS))


def _lineage_spawner(ledger: Ledger, context_id: str) -> str | None:
    record = ledger.contexts[context_id].record
    seen = {context_id}
    while (
        record.rewrite_of is not None
        and record.rewrite_of in ledger.contexts
        and record.rewrite_of not in seen
    ):
        seen.add(record.rewrite_of)
        record = ledger.contexts[record.rewrite_of].record
    return record.spawned_by_call


def admitted_count(ledger: Ledger) -> int:
    """Calls the ledger admitted so far, settled ones included."""
    return len(ledger.calls) + sum(tail.ids.size() for tail in ledger.settled.values())
