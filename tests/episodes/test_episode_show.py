"""`grove episode show` of an episode of 8,000 contexts, running and closed, on real services (the session's
Temporal dev server, its grove worker and store; the CLI in a process of its own).

Running, it pages the `summary` query (each answer bounded: ledger/accounting.py SummaryPage), so the
whole episode is shown although its whole summary is past Temporal's 2 MB payload limit; closed, it shows
the contexts with their spawn links and rewrites from the map the close wrote beside the rows
(activities/episode_map.py), then the rows. The ledger is written as pages and restored by the workflow,
as a long episode's hand-over does (tests/episodes/test_ledger_restore.py), so no test time goes into
opening 8,000 contexts one Update at a time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from grove import queues
from grove.contracts import CloseRequest, EpisodeResult, EpisodeSpec, HarnessSpec
from grove.receipts import ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from grove.store_layout import ledger_page_key
from harnesses import scenario
from ledger.handover import EpisodeCarry, EpisodeRun, changed_pages
from ledger.ledger import Ledger
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WORKERS = 4000  # each with a rewrite: 8,000 contexts (+ the root)
PAGE_ITEMS = 1000
WORKER = "Research-worker-call_{:016x}_0"  # agent ids as long as the Agents SDK's as_tool workers'


def _ledger(episode_id: str) -> Ledger:
    """A root agent, and WORKERS agents each opened and rewritten once (no calls: the ledger's shape is
    what the summary's size depends on)."""
    ledger = Ledger(episode_id=episode_id, group_id="g")
    ledger.open_context(ContextRecord(context_id="parent.0", agent="parent", origin=ContextOrigin.ROOT))
    for i in range(WORKERS):
        agent = WORKER.format(i)
        ledger.open_context(ContextRecord(context_id=f"{agent}.0", agent=agent, origin=ContextOrigin.ROOT))
        ledger.open_context(
            ContextRecord(
                context_id=f"{agent}.1", agent=agent, origin=ContextOrigin.REWRITE, rewrite_of=f"{agent}.0"
            )
        )
    return ledger


def _show(address: str, eid: str, store: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "episode", "show", eid, "--address", address], cwd=REPO,
        env={**os.environ, "GROVE_STORE": str(store), "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=PROCESS_WAIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


async def test_an_episode_of_8000_contexts_is_shown_whole_running_and_closed(
    temporal_server, temporal_client, e2e_store, grove_worker
):
    run = f"show-{uuid.uuid4().hex[:6]}"
    eid = f"{run}/s000001/t0/g0"
    ledger = _ledger(eid)
    assert len(ledger.summary().model_dump_json()) > 2 * 1024 * 1024  # the whole: past Temporal's limit
    keys = []
    for k, page in enumerate(changed_pages(ledger, {}, {}, PAGE_ITEMS)):
        keys.append(ledger_page_key(eid, 0, "handover", k))
        e2e_store.put_if_absent(keys[-1], page.model_dump_json().encode())
    spec = EpisodeSpec(
        run_id=run, step=1, group_id="g", episode_id=eid, task=scenario.make_task(0),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=1),
        ledger_page_items=PAGE_ITEMS,
    )  # fmt: skip
    carried = EpisodeRun(**spec.model_dump(), carry=EpisodeCarry(run_index=1, ledger_pages=keys))
    handle = await temporal_client.start_workflow(
        "EpisodeWorkflow", carried, id=eid, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    # An Update waits for the restored ledger: its answer is the gate.
    late = ContextRecord(context_id="late.0", agent="late", origin=ContextOrigin.ROOT)
    await asyncio.wait_for(handle.execute_update("open_context", late, result_type=ContextRecord), 300)
    opened = [*ledger.contexts, "late.0"]

    running = await asyncio.to_thread(_show, temporal_server.address, eid, e2e_store.root)
    assert running[0].split()[1:] == [eid, "running", "contexts", str(len(opened))]
    shown = [line.split()[1] for line in running if line.startswith("context ")]
    assert shown == opened  # every context once, in opening order
    first = WORKER.format(0)
    assert f"rewrite of {first}.0" in running[3] and f"rewritten by {first}.1" in running[2]

    await handle.execute_update("close", CloseRequest(final_answer="done"))
    result = await handle.result()
    closed = await asyncio.to_thread(_show, temporal_server.address, eid, e2e_store.root)
    assert closed[0].split()[1] == eid
    assert [line.split()[1] for line in closed if line.startswith("context ")] == opened
    assert f"rewrite of {first}.0" in closed[3] and closed[-1].startswith(f"rows      {result.num_rows} at ")
