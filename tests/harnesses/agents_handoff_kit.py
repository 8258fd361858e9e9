"""What every Agents SDK handoff test checks (plain, streamed, Temporal-native), on the script model's
handoff program (tests/harnesses/agents_stream_model.py): the front desk (the root agent, under its own
name) held the handoff in its first call; the specialist it transferred to is a worker of its own whose
context was SPAWNED by that call (no header from the program, no warning in the episode's summary); the
specialist's answer is the run's; the rows are exactly what the engine served, every action owned once."""

from __future__ import annotations

from grove.receipts import CallState, ContextOrigin
from harnesses.clients import Episode
from tests.gateway.test_app_e2e import contexts, summary
from tests.harnesses.agents_stream_model import CARRY_WORD, CONCIERGE_NAME, ROUTE_WORD
from tests.harnesses.framework_kit import nonzero, rows_as_served

FRONT, SPECIALIST = "Front-desk", "Billing-specialist"  # the SDK names of the agents, made header-safe


async def check_handoff_episode(stack, eid: str, episode: Episode, final_output: object) -> None:
    """`final_output`: the run's result (its `final_output`) or the final output itself."""
    answer = str(getattr(final_output, "final_output", final_output))
    assert answer == ROUTE_WORD
    s = await summary(stack.client, eid)
    ctx = contexts(s)
    assert ctx[f"{FRONT}.0"].origin == ContextOrigin.ROOT
    assert nonzero(ctx[f"{FRONT}.0"].counts) == {CallState.COMPLETED: 1}
    spawned = ctx[f"{SPECIALIST}.0"]
    assert (spawned.origin, spawned.spawned_by_call) == (ContextOrigin.SPAWN, f"{FRONT}.0.c0")
    assert nonzero(spawned.counts) == {CallState.COMPLETED: 1}
    assert not s.warnings, s.warnings  # no agent without a spawn link
    closed = await episode.aclose(final_answer=answer, wait=True)
    result = closed["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2}, result
    served = stack.engine.calls_of(eid)
    rows = rows_as_served(stack.store, result["rows_key"], served)
    owned = sorted(s.call_id for row in rows for s in row.spans if s.owned)
    assert owned == sorted([f"{FRONT}.0.c0", f"{SPECIALIST}.0.c0"]) == sorted(served)


async def check_hand_back_episode(stack, eid: str, episode: Episode, result: object) -> None:
    """The concierge (the root agent, under its own name) handed off to the porter, who handed back: the
    porter is spawned by the concierge's call, and the concierge enters again in a new context spawned
    by the porter's call (its history holds the porter's turn, so it extends none of its contexts);
    the concierge's answer is the run's; every action is trained once."""
    assert str(getattr(result, "final_output", result)) == CARRY_WORD
    assert getattr(result, "last_agent", None) is None or result.last_agent.name == CONCIERGE_NAME
    s = await summary(stack.client, eid)
    links = {c.context_id: (c.agent, c.origin, c.spawned_by_call) for c in s.contexts}
    assert links == {
        "Concierge.0": ("Concierge", ContextOrigin.ROOT, None),
        "Porter.0": ("Porter", ContextOrigin.SPAWN, "Concierge.0.c0"),
        "Concierge.1": ("Concierge", ContextOrigin.SPAWN, "Porter.0.c0"),
    }
    assert all(nonzero(c.counts) == {CallState.COMPLETED: 1} for c in s.contexts)
    assert not s.warnings, s.warnings
    closed = await episode.aclose(final_answer=CARRY_WORD, wait=True)
    result_ = closed["result"]
    assert result_["status"] == "ok" and result_["counts"] == {"selected": 3}, result_
    served = stack.engine.calls_of(eid)
    rows = rows_as_served(stack.store, result_["rows_key"], served)
    owned = sorted(s.call_id for row in rows for s in row.spans if s.owned)
    assert owned == ["Concierge.0.c0", "Concierge.1.c0", "Porter.0.c0"] == sorted(served)
