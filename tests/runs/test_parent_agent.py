"""Which agent `parent_only` training trains (activities/episode_io.py `parent_agent`), on real ledgers:
`parent` where the episode has it, else the episode's first root agent that is not auxiliary (an Agents
SDK program's starting agent under its own name), so the parent-only baseline trains a harness that names
its root itself."""

from __future__ import annotations

from activities.episode_io import parent_agent
from tests.forest.kit import Episode, tokens
from trainer.forest import ReconstructionOptions


def records(ep: Episode) -> list:
    return [c.record for c in ep.ledger.contexts.values()]


def test_the_parent_agent_is_parent_where_the_episode_has_it():
    ep = Episode()
    ep.root("t", "parent~title")
    ep.root("p", "parent")
    assert parent_agent(records(ep)) == "parent"
    assert parent_agent([]) == "parent"


def test_a_root_named_by_its_harness_is_the_parent_and_parent_only_trains_it():
    ep = Episode()
    ep.root("a", "Concierge~aux")  # an auxiliary call first: never the parent
    ep.root("c", "Concierge")
    ep.call("c0", "c", tokens([1, 2], [3], [-0.5]))
    ep.spawn("w", "Porter", by="c0")
    ep.call("w0", "w", tokens([4], [5], [-0.25]))
    ep.root("x", "Stray")  # an unspawned agent opened later is not the parent
    assert parent_agent(records(ep)) == "Concierge"
    options = ReconstructionOptions(train_agents="parent_only", parent_agent=parent_agent(records(ep)))
    ep.close()
    rec = ep.reconstruct(options)
    assert sorted(s.call_id for row in rec.rows for s in row.spans if s.owned) == ["c0"]
