"""Episodes that survive storage outages, abandonment, repeated closes and any number of calls.

Real services only: the session's Temporal dev server, one grove worker with the real vLLM engine on the
tiny-random model, the local object store. Calls are the gateway's Updates
(gateway/temporal/episode_client.py), the same path an external harness's requests take.

Every wait is on something the test itself causes and observes (an attempt number in the workflow's
description, the workflow's result); the one timer is the episode's own idle timer, in workflow time.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from gateway.temporal.episode_client import ALREADY_CLOSED, Episodes, EpisodeUpdateRejectedError
from grove.client import workflow_runs
from grove.contracts import CloseRequest, MaterializeInput
from grove.store_layout import ledger_prefix, staging_prefix
from infra.worker_process import wait_until
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.durability.helpers import decoded_inputs, heartbeat_details, pending_activities
from tests.episodes.kit import (
    CountingEpisodes,
    branching_calls,
    each_call_once,
    episode_spec,
    open_and_call,
    start,
    unwritable,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

OLD_IO_ATTEMPTS = 5  # a short retry budget (5 attempts from 1 s, ~15 s): the outage must outlast it


async def _materialize_retrying(handle, at_least: int):
    """The pending materialize activity once it is at attempt >= at_least after a failure, else None."""
    for info in await pending_activities(handle):
        if info.activity_type.name == "materialize_episode" and info.attempt >= at_least:
            return info if info.HasField("last_failure") else None
    return None


async def _pending_retry(handle, activity: str, at_least: int = 2):
    for info in await pending_activities(handle):
        if info.activity_type.name == activity and info.attempt >= at_least and info.HasField("last_failure"):
            return info
    return None


async def _refused_close(episodes: Episodes, episode_id: str, request: CloseRequest) -> str:
    with pytest.raises(EpisodeUpdateRejectedError) as refused:
        await episodes.close(episode_id, request)
    return refused.value.error_type


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_storage_outage_during_materialize_outlasts_the_old_retry_budget(
    temporal_client: Client, grove_worker, e2e_store
):
    """The rows folder refuses writes from close until materialize is past the attempt at which the old
    policy gave up; the episode then completes with its rows, and its staging is cleaned."""
    episodes = Episodes(temporal_client)
    episode_id = await start(temporal_client, episode_spec("blip"))
    calls = await open_and_call(episodes, episode_id, 3)
    handle = temporal_client.get_workflow_handle(episode_id)
    close = CloseRequest(final_answer="done")
    with unwritable(e2e_store.root / "rows"):
        await episodes.close(episode_id, close)
        info = await wait_until(
            lambda: _materialize_retrying(handle, OLD_IO_ATTEMPTS + 1),
            timeout=180,
            what=f"materialize_episode retried past attempt {OLD_IO_ATTEMPTS}",
        )
        # What the UI shows for the stuck activity: the storage error and the phase it heartbeated.
        assert "not permitted" in info.last_failure.message or "denied" in info.last_failure.message
        [details] = await heartbeat_details(temporal_client, info)
        assert details["phase"] == "materialize" and details["attempt"] >= OLD_IO_ATTEMPTS
        # A close is final, also while the episode is still finishing: another close is refused, the
        # same one again is a no-op.
        late = CloseRequest(final_answer="done", failure="harness crashed after close")
        assert await _refused_close(episodes, episode_id, late) == ALREADY_CLOSED
        await episodes.close(episode_id, close)
    result = await asyncio.wait_for(episodes.result(episode_id), 120)
    assert result.status == "ok", result.failure
    assert result.counts == {"selected": 3}
    rows = rows_from_parquet(e2e_store.get(result.rows_key))
    assert len(rows) == result.num_rows == 2  # the two branches from the root, each with the root
    owned = {s.call_id for r in rows for s in r.spans if s.owned}
    assert owned == {c.call_id for c in calls}
    assert e2e_store.list(staging_prefix(episode_id)) == []
    # After the end the memo decides the same way.
    assert await _refused_close(episodes, episode_id, late) == ALREADY_CLOSED
    await episodes.close(episode_id, close)


async def test_abandoned_episode_closes_as_failed_after_its_idle_timeout(
    temporal_client: Client, grove_worker, e2e_store
):
    episodes = Episodes(temporal_client)
    episode_id = await start(temporal_client, episode_spec("idle", idle_timeout_s=3))
    await open_and_call(episodes, episode_id, 2)
    progress = await episodes.progress(episode_id)
    assert progress.idle_timeout_s == 3 and progress.closed_by is None and progress.updates_this_run == 3
    # Nobody closes: the episode's own idle timer (workflow time) ends it.
    result = await asyncio.wait_for(episodes.result(episode_id), 120)
    assert result.status == "failed" and result.failure.startswith("IdleTimeout"), result
    assert result.counts == {"selected": 2}  # complete accounting of what the harness left behind
    [row] = rows_from_parquet(e2e_store.get(result.rows_key))
    assert not row.valid and not row.loss_mask.any()  # the placeholder keeps the group whole
    assert e2e_store.list(staging_prefix(episode_id)) == []
    desc = await temporal_client.get_workflow_handle(episode_id).describe()
    memo = await desc.memo()
    assert memo["idle_timeout_s"] == 3 and memo["close"]["by"] == "idle timeout"
    assert (await episodes.progress(episode_id)).closed_by == "idle timeout"
    # The harness coming back late cannot reopen or re-close it.
    assert await _refused_close(episodes, episode_id, CloseRequest(final_answer="late")) == ALREADY_CLOSED


def _completed_after_handing_over(history) -> int:
    """Updates completed after the run started handing over (the drain of calls in flight)."""
    seen, completed = False, 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            seen = seen or b"handing over" in fields["GroveStatus"].data
        elif seen and event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            completed += 1
    return completed


@pytest.mark.parametrize(
    "n, per_run",
    [
        pytest.param(240, 40, id="240-calls"),
        pytest.param(
            2_400, 300, id="2400-calls", marks=[pytest.mark.long, pytest.mark.timeout(SERVICE_TEST_TIMEOUT)]
        ),
    ],
)
async def test_long_episode_continues_as_new_with_its_ledger(
    temporal_client: Client, grove_worker, e2e_store, n: int, per_run: int
):
    """n calls, 8 at a time, per_run Updates per run, ledger pages of 64 items: several hand-overs with
    calls in flight across each; every call is settled and trained exactly once. (The long suite's
    2,400 calls restore ledgers of up to 37 pages and page the last run's calls before the close.)"""
    spec = episode_spec("long", max_updates_per_run=per_run, ledger_page_items=64)
    episodes = CountingEpisodes(temporal_client)
    episode_id = await start(temporal_client, spec)
    results = await branching_calls(episodes, episode_id, n, at_once=8)
    lost = each_call_once(results, n)
    completed = [r.call_id for r in results]
    progress = await episodes.progress(episode_id)
    assert progress.run_index >= n // per_run - 1 and progress.updates_total == n + 1
    await episodes.close(episode_id, CloseRequest(final_answer="done"))
    result = await asyncio.wait_for(episodes.result(episode_id), 300)
    assert result.status == "ok", result.failure
    assert result.counts == {"selected": n, **({"discarded": len(lost)} if lost else {})}
    rows = rows_from_parquet(e2e_store.get(result.rows_key))
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    assert len(rows) == n - 1 and sorted(owned) == sorted(["parent.c0", *completed])
    runs = await workflow_runs(temporal_client, episode_id)
    assert len(runs) == progress.run_index + 1 >= 5
    assert all(_completed_after_handing_over(h) >= 1 for h in runs[:-1])  # in-flight calls drained
    # The large ledger went through the object store (pages), not a payload, and was cleaned up after.
    last = temporal_client.get_workflow_handle(episode_id)
    [materialize] = await decoded_inputs(temporal_client, last, "materialize_episode", MaterializeInput)
    # (settled hand-overs: the earlier runs' pages are listed by the index chain, the last run's here)
    assert materialize.ledger_index is not None and not materialize.receipts
    # paged before its close (only the last run's changes), closed by materialize as the workflow did
    assert materialize.close_reason == "harness finished"
    assert e2e_store.list(ledger_prefix(episode_id)) == []
    print(
        f"\n{n} calls, {len(runs)} runs, HandingOver retries {episodes.handover_retries}, "
        f"events per run {[len(h.events) for h in runs]}"
    )


async def test_a_close_during_a_blocked_hand_over_finishes_the_episode(
    temporal_client: Client, grove_worker, e2e_store
):
    """The hand-over's ledger pages cannot be written (store outage) and the harness closes meanwhile: the
    close must not be lost to the continue-as-new; the episode finishes in this run with every call."""
    episodes = Episodes(temporal_client)
    spec = episode_spec("close-in-handover", max_updates_per_run=6, ledger_page_items=4)
    episode_id = await start(temporal_client, spec)
    handle = temporal_client.get_workflow_handle(episode_id)
    with unwritable(e2e_store.root / "ledger"):
        # open_context + 5 calls = 6 Updates: the 5th call returns once the run has drained for its hand-over
        await open_and_call(episodes, episode_id, 5)
        blocked = "a retried ledger page write"
        await wait_until(lambda: _pending_retry(handle, "store_ledger_page"), timeout=120, what=blocked)
        await episodes.close(episode_id, CloseRequest(final_answer="done"))
    result = await asyncio.wait_for(episodes.result(episode_id), 120)
    assert result.status == "ok" and result.counts == {"selected": 5}, result
    assert (await episodes.progress(episode_id)).run_index == 0  # finished in the run that took the close
    assert e2e_store.list(ledger_prefix(episode_id)) == []
