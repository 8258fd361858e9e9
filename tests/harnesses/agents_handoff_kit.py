"""What every Agents SDK handoff test checks (plain, streamed, Temporal-native), on the script model's
handoff program (tests/harnesses/agents_stream_model.py): the front desk's first call (`parent.0.c0`)
held the handoff; the specialist it transferred to is a worker of its own whose context was SPAWNED by
that call (no header from the program, no warning in the episode's summary); the specialist's answer
is the run's; the rows are exactly what the engine served, every action owned once."""

from __future__ import annotations

from grove.receipts import CallState, ContextOrigin
from harnesses.clients import Episode, header_safe
from tests.gateway.test_app_e2e import contexts, summary
from tests.harnesses.agents_stream_model import ROUTE_WORD, SPECIALIST_NAME
from tests.harnesses.framework_kit import nonzero, rows_as_served

SPECIALIST = header_safe(SPECIALIST_NAME)


async def check_handoff_episode(stack, eid: str, episode: Episode, final_output: object) -> None:
    """`final_output`: the run's result (its `final_output`) or the final output itself."""
    answer = str(getattr(final_output, "final_output", final_output))
    assert answer == ROUTE_WORD
    s = await summary(stack.client, eid)
    ctx = contexts(s)
    assert ctx["parent.0"].origin == ContextOrigin.ROOT
    assert nonzero(ctx["parent.0"].counts) == {CallState.COMPLETED: 1}
    spawned = ctx[f"{SPECIALIST}.0"]
    assert (spawned.origin, spawned.spawned_by_call) == (ContextOrigin.SPAWN, "parent.0.c0")
    assert nonzero(spawned.counts) == {CallState.COMPLETED: 1}
    assert not s.warnings, s.warnings  # no agent without a spawn link
    closed = await episode.aclose(final_answer=answer, wait=True)
    result = closed["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2}, result
    served = stack.engine.calls_of(eid)
    rows = rows_as_served(stack.store, result["rows_key"], served)
    owned = sorted(s.call_id for row in rows for s in row.spans if s.owned)
    assert owned == sorted(["parent.0.c0", f"{SPECIALIST}.0.c0"]) == sorted(served)
