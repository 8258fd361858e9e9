"""SIGKILL the worker process in the middle of a worker agent's model call: the episode completes on a
new worker process, the lost attempt is accounted as discarded and its retry is the call that is trained.

Real parts: the Temporal dev server, `grove worker` subprocesses (vLLM on the tiny-random model), the
local object store. The kill lands inside a `generate` activity by construction, not by timing: the
test arms the worker's `generate` gate (grove/gates.py) for worker agents' calls, so each of them is
held in flight, inside its started activity, after vLLM sampled it and before the activity returns.
The scenario's two workers start together after the parent's first call, so the state the test waits
for (worker-1's and worker-2's first calls both held) comes and stays until the test acts.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from grove import queues
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec, MaterializeInput
from grove.receipts import CallState
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.worker_process import wait_until
from ledger.accounting import LedgerSummary
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT
from tests.durability.helpers import (
    decoded_inputs,
    is_started,
    pending_activities,
    scheduled_call_ids,
    wait_held,
)
from trainer.rows import rows_from_parquet
from workflows.episode import EpisodeWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SAMPLING = SamplingConfig(max_tokens=8)
WORKER_CALLS = r"/worker-[^/]*/[^/]*$"  # request ids of worker agents' calls: {episode}/{call}/{attempt}
FIRST_WORKER_CALLS = {"worker-1.0.c0", "worker-2.0.c0"}  # spawned together: both are held at once

# The scenario's calls (harnesses/scenario.py), written out, and its rows: endpoint -> calls in order.
ALL_CALLS = {
    "parent.0.c0", "parent.0.c1",
    "worker-1.0.c0", "worker-1.0.c1", "worker-1.0.c2", "worker-1.1.c0",  # c2: the compaction's summary call
    "worker-2.0.c0",
}  # fmt: skip
SUMMARY_CALL = "worker-1.0.c2"  # settles auxiliary (its kind), trained here (train_auxiliary: [summary])
EXPECTED_ROWS = [
    ["parent.0.c0", "parent.0.c1"],
    ["worker-1.0.c0", "worker-1.0.c1", "worker-1.0.c2"],
    ["worker-1.1.c0"],
    ["worker-2.0.c0"],
]


def episode_spec() -> EpisodeSpec:
    run = f"dur-worker-kill-{uuid.uuid4().hex[:6]}"
    return EpisodeSpec(
        run_id=run, step=0, group_id=f"{run}/t0", episode_id=f"{run}/t0/g0", task=scenario.make_task(0),
        harness=HarnessSpec(program=scenario.NAME), sampling=SAMPLING,
        train_auxiliary=["summary"],  # worker-1's summary call is trained (selected) like its actions
    )  # fmt: skip


async def started_worker_calls(handle) -> list[str]:
    """Activity ids of the started `generate` activities, once every pending call is a worker agent's
    and each has its activity started (so no call is between scheduling and a worker's poll)."""
    summary = await handle.query(EpisodeWorkflow.summary, result_type=LedgerSummary)
    pending = [(ctx.agent, c) for ctx in summary.contexts for c in ctx.pending]
    if not pending or not all(agent.startswith("worker-") for agent, _ in pending):
        return []
    acts = [a for a in await pending_activities(handle) if a.activity_type.name == "generate"]
    if len(acts) != len(pending) or not all(is_started(a) for a in acts):
        return []
    return [a.activity_id for a in acts]


def renamed(call_id: str, lost: set[str]) -> str:
    return f"{call_id}.r1" if call_id in lost else call_id


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_worker_sigkill_mid_worker_call_discards_the_lost_attempt(stack):
    await stack.up()
    client, old = stack.client, stack.main
    spec = episode_spec()
    stack.gates.clear("generate")
    stack.gates.arm("generate", WORKER_CALLS)
    handle = await client.start_workflow(
        EpisodeWorkflow.run, spec, id=spec.episode_id, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    held = await wait_held(stack, "generate", 2, "both workers' first calls held in flight")
    assert {r.rsplit("/", 2)[1] for r in held} == FIRST_WORKER_CALLS, held
    # Held inside their activities: both are started on the worker, and they are all that is pending
    # (a held call stays pending, so this is a state to read, not a moment to catch).
    started = await wait_until(
        lambda: started_worker_calls(handle), 30, "the held calls' activities shown as started"
    )
    killed_pid = old.pid
    old.kill()
    lost = set((await scheduled_call_ids(client, handle, started)).values())
    assert lost == FIRST_WORKER_CALLS, lost

    stack.gates.disarm("generate")  # the retries run through
    old.start()  # a new process (new pid) on the same queues
    assert old.pid != killed_pid
    await old.wait_ready(client)
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)

    # the episode completed; every admitted call is in exactly one terminal state
    assert result.status == "ok", result.failure
    assert result.counts == {"selected": len(ALL_CALLS) - 1, "auxiliary": 1, "discarded": len(lost)}
    [materialized] = await decoded_inputs(client, handle, "materialize_episode", MaterializeInput)
    receipts = {r.call_id: r for r in materialized.receipts}
    assert set(receipts) == ALL_CALLS - lost | lost | {f"{c}.r1" for c in lost}
    for call_id, receipt in receipts.items():
        if call_id in lost:
            # the lost attempt: discarded, with the reason (a heartbeat timeout of the dead worker)
            assert receipt.state == CallState.DISCARDED
            assert (
                receipt.note
                and receipt.note.startswith("lost attempt:")
                and "timeout" in receipt.note.lower()
            )
            assert receipt.digests is None  # its tokens were never recorded
            print(f"{call_id}: {receipt.state.value}: {receipt.note}")
        elif call_id == SUMMARY_CALL:
            assert receipt.state == CallState.AUXILIARY, (call_id, receipt)
        else:
            assert receipt.state == CallState.SELECTED, (call_id, receipt)

    # rows: the retries take the lost calls' places; no call twice, the lost attempts nowhere
    rows = rows_from_parquet(LocalStore(stack.store_dir).get(result.rows_key))
    spans = sorted([s.call_id for s in row.spans] for row in rows)
    assert spans == sorted([renamed(c, lost) for c in row] for row in EXPECTED_ROWS)
    flat = [s.call_id for row in rows for s in row.spans]
    assert len(flat) == len(set(flat)) and not lost & set(flat)
    assert sorted(s.call_id for row in rows for s in row.spans if s.owned) == sorted(
        renamed(c, lost) for c in ALL_CALLS
    )
