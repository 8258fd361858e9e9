"""A long episode's hand-overs carry only its live calls (the history per run bounded).

Each continue-as-new of a paged ledger writes the ledger's pages, settles every call older than its
context's branch window (ledger/settlement.py `settle`) and carries the rest: what the next run restores
is bounded by the live calls, not by the episode's length. Measured here on the runs' real histories:
the bytes each run restored (its start input, which carries the ledger, plus any `load_ledger_page`
results) stay flat while the calls before it grow several-fold; and the settled calls are still every
one accounted and trained once (materialize joins the pages).

Real services: the session's Temporal dev server and grove worker (vLLM on the tiny model), the local
store. Calls are the gateway's Updates (gateway/temporal/episode_client.py), HandingOver retried, 4 at a time.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from grove.client import workflow_runs
from grove.contracts import CloseRequest, MaterializeInput
from grove.store_layout import ledger_prefix
from ledger.handover import EpisodeRun
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT
from tests.durability.helpers import decoded_inputs
from tests.episodes.kit import (
    CountingEpisodes,
    branching_calls,
    each_call_once,
    episode_spec,
    start,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

CALLS = 200
PER_RUN = 30
WINDOW = 4


def _restored_bytes(history) -> int:
    """What a run restored of its ledger, as the history holds it: the start input (the carry) and the
    results of the ledger pages it loaded."""
    started = history.events[0].workflow_execution_started_event_attributes
    loads = {
        e.event_id
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "load_ledger_page"
    }
    loaded = sum(
        e.activity_task_completed_event_attributes.result.ByteSize()
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
        and e.activity_task_completed_event_attributes.scheduled_event_id in loads
    )
    return started.input.ByteSize() + loaded


async def _start_input(history) -> EpisodeRun:
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [run] = await pydantic_data_converter.decode(payloads, [EpisodeRun])
    return run


def _updates(history) -> int:
    return sum(1 for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes"))


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_the_restore_per_run_stays_flat_while_the_episode_grows(
    temporal_client: Client, grove_worker, e2e_store
):
    spec = episode_spec("settle", max_updates_per_run=PER_RUN, ledger_page_items=16, branch_window=WINDOW)
    episodes = CountingEpisodes(temporal_client)
    episode_id = await start(temporal_client, spec)
    results = await branching_calls(episodes, episode_id, CALLS, at_once=4)
    lost = each_call_once(results, CALLS)
    # The summary query counts every call, settled or live (the gateway numbers calls from the same
    # per-context counts, in its context_view).
    summary = await episodes.summary(episode_id)
    assert sum(summary.totals.values()) == CALLS and summary.contexts[0].head is not None
    await episodes.close(episode_id, CloseRequest(final_answer="done"))
    result = await asyncio.wait_for(episodes.result(episode_id), RESULT_WAIT)
    assert result.status == "ok", result.failure
    # settled calls included: materialize joined the pages
    assert result.counts == {"selected": CALLS, **({"discarded": len(lost)} if lost else {})}
    rows = rows_from_parquet(e2e_store.get(result.rows_key))
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    completed = ["parent.c0", *(r.call_id for r in results)]
    assert len(rows) == CALLS - 1 and sorted(owned) == sorted(completed)

    runs = await workflow_runs(temporal_client, episode_id)
    assert len(runs) >= 5
    restored = [_restored_bytes(h) for h in runs]
    calls_before = [sum(_updates(h) for h in runs[:k]) for k in range(len(runs))]
    carries = [(await _start_input(h)).carry for h in runs[1:]]
    # every hand-over settled, and carried its live calls inline: the next run loaded no page
    assert all(c is not None and c.settled and c.ledger is not None and not c.live_pages for c in carries)
    assert all(len(c.ledger.calls) <= WINDOW + 1 for c in carries), [len(c.ledger.calls) for c in carries]
    print(f"\nrestored bytes per run {restored}, calls before each run {calls_before}")
    later = restored[1:]
    assert calls_before[-1] >= 4 * calls_before[1]
    assert max(later) <= 1.2 * min(later), later  # flat, while the calls before it grew >= 4x
    # the large ledger reached materialize as pages (every call's last state), closed there
    last = temporal_client.get_workflow_handle(episode_id)
    [materialize] = await decoded_inputs(temporal_client, last, "materialize_episode", MaterializeInput)
    assert materialize.ledger_index is not None and not materialize.receipts
    assert e2e_store.list(ledger_prefix(episode_id)) == []
