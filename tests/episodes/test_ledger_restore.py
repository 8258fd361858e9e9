"""A paged ledger is restored one page per workflow task (Temporal's deadlock detector).

Restoring every page of a long episode's ledger in one workflow task can take over 2 s (~2.3 MB of packed
pages on a loaded worker), and Temporal fails such a task (`_DeadlockError`). The restore must do a bounded
amount of work per workflow task however large the ledger is: this test counts it, deterministically,
through the `progress` query (`RestoreProgress.most_pages_per_task`: pages unpacked by one task, told
apart by the history length each task sees). Times are the bench's (bench/bench_ledger_restore.py).

Real services: the session's Temporal dev server, its worker (`grove_worker`: a second worker on the
episodes queue in the same process is refused by the SDK once other tests have started the session's)
and its local store.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from grove import queues
from grove.contracts import EpisodeProgress, EpisodeSpec, HarnessSpec
from grove.receipts import ContextOrigin, ContextRecord, TokenDigests
from grove.sampling import SamplingConfig
from grove.store_layout import ledger_page_key
from harnesses import scenario
from ledger.accounting import LedgerSummary
from ledger.handover import EpisodeCarry, EpisodeRun, changed_pages
from ledger.ledger import Ledger
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

CALLS = 90
PER_RUN = 25  # calls per earlier workflow run: each wrote what changed since its restore
PAGE_ITEMS = 8


def _paged_ledger(store: LocalStore, episode_id: str) -> tuple[Ledger, list[str]]:
    """A ledger of CALLS calls in two contexts, written as a long episode's hand-overs write it."""
    ledger = Ledger(episode_id=episode_id, group_id="g")
    for ctx in ("parent", "other"):
        ledger.open_context(ContextRecord(context_id=ctx, agent=ctx, origin=ContextOrigin.ROOT))
    saved_contexts: dict = {}
    saved_calls: dict = {}
    keys: list[str] = []
    run = 0
    for i in range(CALLS):
        ctx = ("parent", "other")[i % 2]
        call_id = f"{ctx}.c{i}"
        root = f"{ctx}.c{i % 2}"
        digests = TokenDigests(prompt_len=6 if i < 2 else 8, completion_len=1, prompt_sha256=f"p{i}",
                               completion_sha256=f"c{i}", logprobs_sha256=f"l{i}")  # fmt: skip
        ledger.admit(call_id, ctx, extends=None if i < 2 else root, branch=i >= 2)
        ledger.complete(call_id, f"staging/{episode_id}/{call_id}.safetensors", digests, 0, "length")
        if i % 7 == 3 and i > 2:
            ledger.discard(call_id, "not used")  # a settled call changes after its first page
        if (i + 1) % PER_RUN == 0 or i + 1 == CALLS:
            for k, page in enumerate(changed_pages(ledger, saved_contexts, saved_calls, PAGE_ITEMS)):
                keys.append(ledger_page_key(episode_id, run, "handover", k))
                store.put_if_absent(keys[-1], page.model_dump_json().encode())
            saved_contexts = {k: v.model_copy(deep=True) for k, v in ledger.contexts.items()}
            saved_calls = dict(ledger.calls)
            run += 1
    return ledger, keys


async def test_a_paged_ledger_is_restored_one_page_per_workflow_task(
    temporal_client: Client, e2e_store: LocalStore, grove_worker
):
    run = f"ep-restore-{uuid.uuid4().hex[:6]}"
    episode_id = f"{run}/s000001/t0/g0"
    ledger, keys = _paged_ledger(e2e_store, episode_id)
    assert len(keys) >= 12
    spec = EpisodeSpec(
        run_id=run, step=1, group_id="g", episode_id=episode_id, task=scenario.make_task(0),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=1),
        ledger_page_items=PAGE_ITEMS,
    )  # fmt: skip
    carried = EpisodeRun(**spec.model_dump(), carry=EpisodeCarry(run_index=4, ledger_pages=keys))
    handle = await temporal_client.start_workflow(
        "EpisodeWorkflow", carried, id=episode_id, task_queue=queues.EPISODES
    )
    try:
        # An Update waits for the restored ledger: its answer is the gate (no polling).
        late = ContextRecord(context_id="late", agent="late", origin=ContextOrigin.ROOT)
        await asyncio.wait_for(handle.execute_update("open_context", late, result_type=ContextRecord), 300)
        progress = await handle.query("progress", result_type=EpisodeProgress)
        assert progress.restore is not None
        assert progress.restore.pages_total == progress.restore.pages_done == len(keys)
        assert progress.restore.most_pages_per_task == 1, progress.restore
        # the restored ledger is the written one (plus the context opened after the restore)
        ledger.open_context(late)
        assert await handle.query("summary", result_type=LedgerSummary) == ledger.summary()
        # every page was loaded once, each load scheduled by a workflow task of its own
        history = await handle.fetch_history()
        scheduled = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        loads = [
            e.activity_task_scheduled_event_attributes for e in history.events if e.event_type == scheduled
        ]
        assert [a.activity_type.name for a in loads] == ["load_ledger_page"] * len(keys)
        assert len({a.workflow_task_completed_event_id for a in loads}) == len(keys)
    finally:
        await handle.terminate("test done")
