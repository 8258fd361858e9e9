"""While a continued-as-new episode run loads its ledger's pages, its ledger queries answer `LedgerRestoring`
instead of answering from part of the ledger, and the gateway's client and `grove episode show` wait for the
restore (grove/ledger_restoring.py).

A gateway that planned a request from a partial view would take a context not loaded yet for absent and
open it a second time. The test holds the restore at gate `ledger_page_load` (grove/gates.py) on the last
page, whose context is then unknown to a partial ledger, asks while it is held, releases it, and checks
the answers after it name that context. Nothing is timed: the held restore lasts as long as the test
needs it.

Real services: the session's Temporal dev server, its grove worker and store; the CLI in processes of its
own.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowQueryFailedError

from gateway.temporal.episode_client import Episodes, LedgerRestoringError
from grove import queues
from grove.contracts import EpisodeProgress, EpisodeSpec, HarnessSpec
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from grove.receipts import ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from grove.store_layout import ledger_page_key
from harnesses import scenario
from infra.worker_process import wait_until
from ledger.accounting import SummaryPage
from ledger.context_view import ViewRequest
from ledger.handover import EpisodeCarry, EpisodeRun, changed_pages
from ledger.ledger import Ledger
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

REPO = Path(__file__).resolve().parents[2]
AGENTS = [f"agent{i}" for i in range(5)]
PAGE_ITEMS = 2  # five contexts: pages of 2, 2 and 1; the last holds agent4's context alone
LAST_AGENT = "agent4"
QUERIES = [
    ("summary", SummaryPage()),
    ("context_view", ViewRequest(agents=[LAST_AGENT])),
    ("delivery_refusal", "agent4.0.c0"),
    ("call_states", ["agent4.0.c0"]),
]


def _pages(store, episode_id: str) -> list[str]:
    ledger = Ledger(episode_id=episode_id, group_id="g")
    for agent in AGENTS:
        ledger.open_context(ContextRecord(context_id=f"{agent}.0", agent=agent, origin=ContextOrigin.ROOT))
    keys = []
    for k, page in enumerate(changed_pages(ledger, {}, {}, PAGE_ITEMS)):
        keys.append(ledger_page_key(episode_id, 0, "handover", k))
        store.put_if_absent(keys[-1], page.model_dump_json().encode())
    return keys


def _cli(address: str, eid: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "episode", "show", eid, "--address", address, *args]


def _cli_env(store: Path) -> dict[str, str]:
    return {**os.environ, "GROVE_STORE": str(store), "PYTHONPATH": str(REPO)}


async def test_ledger_queries_wait_for_a_restore_instead_of_answering_from_part_of_it(
    temporal_server, temporal_client, e2e_store, grove_worker, tmp_path, monkeypatch
):
    run = f"restoring-{uuid.uuid4().hex[:6]}"
    eid = f"{run}/s000001/t0/g0"
    keys = _pages(e2e_store, eid)
    assert len(keys) == 3
    gates = GateControl(tmp_path / "gates")
    gates.arm("ledger_page_load", f"^{re.escape(keys[-1])}$")
    monkeypatch.setenv(GATES_ENV, str(gates.root))  # the session's worker runs in this process
    spec = EpisodeSpec(
        run_id=run, step=1, group_id="g", episode_id=eid, task=scenario.make_task(0),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=1),
        ledger_page_items=PAGE_ITEMS,
    )  # fmt: skip
    carried = EpisodeRun(**spec.model_dump(), carry=EpisodeCarry(run_index=1, ledger_pages=keys))
    handle = await temporal_client.start_workflow(
        "EpisodeWorkflow", carried, id=eid, task_queue=queues.EPISODES
    )
    episodes, impatient = Episodes(temporal_client), Episodes(temporal_client)
    impatient.restore_patience = 0.0
    try:

        async def last_page_held() -> bool:
            return gates.held("ledger_page_load") == [keys[-1]]

        await wait_until(last_page_held, STATE_WAIT, "the restore's last page load held at its gate")

        # every ledger query is refused, naming the restore; progress answers and shows it
        for name, arg in QUERIES:
            with pytest.raises(WorkflowQueryFailedError) as refused:
                await handle.query(name, arg)
            assert refused.value.message.startswith(f"LedgerRestoring: episode {eid!r} is restoring"), name
            assert (
                "of 3 pages loaded" in refused.value.message and f"the {name} query" in refused.value.message
            )
        progress = await handle.query("progress", result_type=EpisodeProgress)
        assert progress.restore is not None and progress.restore.pages_total == 3
        assert progress.restore.pages_done < 3

        # the gateway's client: a bounded wait (503 after it), else asking again until the restore is done
        with pytest.raises(LedgerRestoringError, match="LedgerRestoring: .*retry the request"):
            await impatient.context_view(eid, ViewRequest(agents=[LAST_AGENT]))
        view = asyncio.create_task(episodes.context_view(eid, ViewRequest(agents=[LAST_AGENT])))

        async def refused_once() -> bool:
            return episodes.restoring_waits >= 1

        await wait_until(refused_once, STATE_WAIT, "the client's context_view refused by the restore")
        assert not view.done()  # held: no answer from part of the ledger

        # `grove episode show`: exit 7 after --wait; a patient one says it waits, and shows all once restored
        env = _cli_env(e2e_store.root)
        quick = await asyncio.to_thread(
            subprocess.run, _cli(temporal_server.address, eid, "--wait", "0"), cwd=REPO,
            env=env, capture_output=True, text=True, timeout=PROCESS_WAIT,
        )  # fmt: skip
        assert quick.returncode == 7, quick.stderr[-3000:]
        assert "LedgerRestoring: " in quick.stderr and "still restoring after 0 s" in quick.stderr
        patient = subprocess.Popen(
            _cli(temporal_server.address, eid, "--wait", str(STATE_WAIT)), cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            said = await asyncio.wait_for(asyncio.to_thread(_first_restoring_line, patient), PROCESS_WAIT)
            assert said.startswith(f"LedgerRestoring: episode {eid!r}"), said
            assert patient.poll() is None  # still waiting for the held restore

            gates.disarm("ledger_page_load")  # the last page loads: the ledger is whole
            restored = await asyncio.wait_for(view, STATE_WAIT)
            assert restored.context_counts == {LAST_AGENT: 1}
            assert [c.context_id for c in restored.contexts] == ["agent4.0"]
            out, err = await asyncio.to_thread(patient.communicate, timeout=PROCESS_WAIT)
            assert patient.returncode == 0, err[-3000:]
            lines = out.splitlines()
            assert lines[0].split()[1:] == [eid, "running", "contexts", "5"]
            assert [line.split()[1] for line in lines if line.startswith("context ")] == [
                f"{agent}.0" for agent in AGENTS
            ]
        finally:
            if patient.poll() is None:
                patient.kill()
                patient.wait()
        assert await handle.query("call_states", ["agent4.0.c0"], result_type=dict) == {}
    finally:
        gates.disarm("ledger_page_load")
        await handle.terminate("test done")


def _first_restoring_line(process: subprocess.Popen) -> str:
    """The first stderr line of `grove episode show` that reports the restore ("" at end of output)."""
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("LedgerRestoring"):
            return line
    return ""
