"""The shape of an episode's forest and who owns each call's loss (pure, ids only, no tokens).

Given the forest members (call -> its context and verified parent), this module computes each call's
depth, the endpoints (members with no member child) in canonical order, and the owner of every call:
the first endpoint, in canonical order, among the call's descendants (itself included). Canonical
order uses stable ids only — (context_id, depth, call_id) — never arrival order, so the same calls in
any admission or completion order give the same plan. Every call has exactly one owner, so each
eligible action gets loss in exactly one row.

Linear in the number of calls (plus one sort).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# (context_id, depth, call_id): the canonical sort key of a call / endpoint / row.
CanonicalKey = tuple[str, int, str]


class CyclicAncestryError(ValueError):
    """Parent links that loop back on themselves: no call of the loop has a root."""

    def __init__(self, episode_id: str, call_ids: list[str]) -> None:
        self.episode_id = episode_id
        self.call_ids = call_ids
        super().__init__(
            f"episode {episode_id}: parent links of calls {call_ids} form a cycle; expected every call to "
            "reach a root (parent_call_id=None) of its context; the receipts are corrupt: rebuild them "
            "from the ledger"
        )


@dataclass(frozen=True)
class Link:
    """A forest member: its context and its parent (None for a root)."""

    context_id: str
    parent: str | None


@dataclass(frozen=True)
class ForestPlan:
    """Depths, canonical endpoints and loss owners of one episode's forest."""

    links: Mapping[str, Link]
    depth: Mapping[str, int]
    endpoints: tuple[str, ...]  # canonical order
    owner: Mapping[str, str]  # every member -> the endpoint whose row carries its loss

    def key(self, call_id: str) -> CanonicalKey:
        return (self.links[call_id].context_id, self.depth[call_id], call_id)

    def path(self, endpoint: str) -> list[str]:
        """Call ids from the root down to `endpoint`."""
        out = []
        node: str | None = endpoint
        while node is not None:
            out.append(node)
            node = self.links[node].parent
        out.reverse()
        return out


def _depths(episode_id: str, links: Mapping[str, Link]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for start in links:
        chain: list[str] = []
        on_chain: set[str] = set()
        node: str | None = start
        while node is not None and node not in depth:
            if node in on_chain:
                raise CyclicAncestryError(episode_id, chain[chain.index(node) :])
            chain.append(node)
            on_chain.add(node)
            node = links[node].parent
        base = -1 if node is None else depth[node]
        for offset, member in enumerate(reversed(chain), start=1):
            depth[member] = base + offset
    return depth


def plan_forest(episode_id: str, links: Mapping[str, Link]) -> ForestPlan:
    """Depths, canonical endpoints and owners. Parents must be members (checked by the caller)."""
    depth = _depths(episode_id, links)
    has_child = {link.parent for link in links.values() if link.parent is not None}

    def key(call_id: str) -> CanonicalKey:
        return (links[call_id].context_id, depth[call_id], call_id)

    # Deepest first: every child is settled before its parent, so best[] is final when read.
    best: dict[str, CanonicalKey] = {}
    for call_id in sorted(links, key=lambda c: (-depth[c], c)):
        if call_id not in has_child:
            best[call_id] = key(call_id)
        parent = links[call_id].parent
        if parent is not None and (parent not in best or best[call_id] < best[parent]):
            best[parent] = best[call_id]
    endpoints = tuple(sorted((c for c in links if c not in has_child), key=key))
    return ForestPlan(links=links, depth=depth, endpoints=endpoints, owner={c: k[2] for c, k in best.items()})
