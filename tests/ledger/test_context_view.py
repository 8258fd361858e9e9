"""The `context_view` query (ledger/context_view.py): what one gateway request needs of the ledger, in a
payload whose size does not depend on the episode's, and routing on it (gateway/pipeline/routing.py).

Real ledgers of many contexts; the view of one request's agents is compared with the whole summary's
answer for the same questions, and its serialized size measured at 10 and 5,000 other contexts.
"""

from __future__ import annotations

import pytest

from gateway.pipeline.identity import grove_identity
from gateway.pipeline.routing import ContextOwnershipError, route, view_request
from grove.receipts import ContextOrigin, ContextRecord
from ledger.context_view import ContextView, ViewRequest, admitted_count, context_view
from tests.forest.kit import Episode, tokens

T = tokens([1, 2], [3], [-0.5])


def episode(others: int) -> Episode:
    """parent (two rewrites), a worker spawned twice, and `others` one-call root agents a0, a1, ..."""
    ep = Episode()
    ep.root("parent.0", "parent")
    ep.call("parent.0.c0", "parent.0", T)
    ep.rewrite("parent.1", "parent", of="parent.0")
    ep.call("parent.1.c0", "parent.1", T)
    ep.rewrite("parent.2", "parent", of="parent.1")
    ep.spawn("w.0", "w", by="parent.0.c0")
    ep.spawn("w.1", "w", by="parent.1.c0")
    ep.call("w.1.c0", "w.1", T)
    ep.rewrite("w.2", "w", of="w.1")
    for i in range(others):
        ep.root(f"a{i}.0", f"a{i}")
        ep.call(f"a{i}.0.c0", f"a{i}.0", T)
    return ep


def view(ep: Episode, headers: dict[str, str]) -> ContextView:
    return context_view(ep.ledger, view_request(headers), closing=False)


def test_a_view_holds_the_requests_live_contexts_with_what_the_summary_says_of_them():
    ep = episode(others=3)
    v = view(ep, {"x-grove-agent": "w"})
    summary = {c.context_id: c for c in ep.ledger.summary().contexts}
    assert sorted(c.context_id for c in v.contexts) == ["parent.2", "w.0", "w.2"]  # live ones only
    assert all(c == summary[c.context_id] for c in v.contexts)
    assert v.context_counts["w"] == 3 and v.context_counts["parent"] == 3
    assert v.next_context["w"] == "w.3" and "a0" not in v.context_counts  # a0 not asked: not scanned out
    assert v.lineage_spawners["w.2"] == "parent.1.c0"  # a rewrite's spawner is its first context's
    assert v.root_agents == ["parent", "a0"]
    # a named context is in the view even when retired (a request may name it and be refused there)
    assert "parent.0" in {c.context_id for c in view(ep, {"x-grove-context": "parent.0"}).contexts}


def test_the_view_of_a_request_does_not_grow_with_the_episode():
    small, large = episode(others=10), episode(others=5000)
    headers = {"x-grove-agent": "a3"}
    assert len(large.ledger.summary().model_dump_json()) > 50 * len(small.ledger.summary().model_dump_json())
    assert len(view(small, headers).model_dump_json()) == len(view(large, headers).model_dump_json())
    assert admitted_count(large.ledger) == 3 + 5000


def test_an_agents_next_context_skips_ids_it_named_itself():
    ep = Episode()
    ep.root("parent.0", "parent")
    ep.call("parent.0.c0", "parent.0", T)
    ep.ledger.open_context(
        ContextRecord(
            context_id="parent.1", agent="parent", origin=ContextOrigin.REWRITE, rewrite_of="parent.0"
        )
    )
    ep.ledger.open_context(
        ContextRecord(
            context_id="parent.3", agent="parent", origin=ContextOrigin.REWRITE, rewrite_of="parent.1"
        )
    )
    assert (
        context_view(ep.ledger, ViewRequest(agents=["parent"]), closing=False).next_context["parent"]
        == "parent.4"
    )


def test_no_agent_can_name_a_context_of_another_agents_name_space():
    """An agent `squat` opening `x-grove-context: parent.1` is refused, naming agent, context and owner,
    so it cannot block the parent's later rewrites (409 ContextConflictError): the parent's rewrite gets
    its id whatever other agents sent."""
    ep = Episode()
    ep.root("parent.0", "parent")
    ep.call("parent.0.c0", "parent.0", T)
    squat = {"x-grove-agent": "squat", "x-grove-context": "parent.1"}
    with pytest.raises(ContextOwnershipError) as err:
        route(view(ep, squat), grove_identity(squat))
    assert (err.value.agent, err.value.context_id, err.value.owner) == ("squat", "parent.1", "parent")
    assert "'squat'" in str(err.value) and "'parent.1'" in str(err.value) and "'parent'" in str(err.value)
    theirs = {"x-grove-agent": "squat", "x-grove-context": "parent.0"}  # an existing context of another agent
    with pytest.raises(ContextOwnershipError, match="belongs to agent 'parent'"):
        route(view(ep, theirs), grove_identity(theirs))
    rewrite = {"x-grove-rewrite": "1"}
    assert route(view(ep, rewrite), grove_identity(rewrite)).rewrite_id == "parent.1"
    # a new context named without its agent is its owner's
    target = route(view(ep, {"x-grove-context": "solo.0"}), grove_identity({"x-grove-context": "solo.0"}))
    assert (target.agent, target.opening.context_id) == ("solo", "solo.0")
