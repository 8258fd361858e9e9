"""SIGKILL the Temporal dev server while step 1's episodes are generating, restart it on the same port
and SQLite file: the training run continues at the same step with the same data order, every episode
exists once, and each step is trained exactly once.

Real parts: the dev server (killed and restarted), `grove worker` subprocesses that are never
restarted (they reconnect by themselves), vLLM on the tiny-random model, the local object store.
The kill lands mid-call by construction: the worker's `generate` gate (grove/gates.py) holds step 1's
calls in flight, inside their started activities, until the server is down; then they are released
and complete (or are lost) while it is down.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from grove import queues
from grove.contracts import (
    EpisodeResult,
    HarnessSpec,
    RunConfig,
    RunResult,
    RunState,
    TrainStepInput,
    TrainStepResult,
)
from grove.data_order import task_indices
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.worker_process import wait_until
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import (
    activity_attempts,
    activity_results,
    decoded_inputs,
    is_started,
    pending_activities,
    wait_held,
    workflow_ids_of_run,
)
from trainer.rows import rows_from_parquet
from workflows.training_run import TrainingRunWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

TASKS_PER_STEP, GROUP_SIZE, NUM_TASKS, SEED = 2, 2, 5, 7
SCENARIO_CALLS = 7  # harnesses/scenario.py: parent 2, worker-1 3 + 1 after its compaction, worker-2 1
SUMMARY_CALLS = 1  # worker-1's compaction: settles auxiliary (its kind), trained (train_auxiliary)
DOWNTIME_S = 3.0  # long enough for every worker poll and in-flight completion to fail


def run_config(model: str) -> RunConfig:
    return RunConfig(
        run_id=f"dur-server-kill-{uuid.uuid4().hex[:6]}", model=model, seed=SEED, steps=2,
        task_family=scenario.NAME, num_tasks=NUM_TASKS, tasks_per_step=TASKS_PER_STEP, group_size=GROUP_SIZE,
        harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
        learner=LearnerConfig(lr=1e-3), train_auxiliary=["summary"],
    )  # fmt: skip


def expected_episode_ids(cfg: RunConfig, step: int) -> list[str]:
    """Written from the documented id scheme {run}/s{step:06d}/t{task}/g{j}, not from the workflow."""
    tasks = task_indices(cfg.seed, step, cfg.tasks_per_step, cfg.num_tasks)
    return sorted(f"{cfg.run_id}/s{step:06d}/t{t}/g{j}" for t in tasks for j in range(cfg.group_size))


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_server_sigkill_mid_step_resumes_on_the_same_database(stack):
    await stack.up()
    client, server = stack.client, stack.server
    cfg = run_config(str(stack.model))
    pids = (stack.main.pid, stack.trainer.pid)
    step1 = expected_episode_ids(cfg, 1)
    stack.gates.clear("generate")
    stack.gates.arm("generate", f"^{re.escape(cfg.run_id)}/s000001/")
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip
    held = await wait_held(stack, "generate", 1, "a step-1 call held in flight")
    in_flight = held[0].rsplit("/", 2)[0]
    [act] = [
        a for a in await pending_activities(client.get_workflow_handle(in_flight))
        if a.activity_type.name == "generate"
    ]  # fmt: skip
    assert is_started(act)  # the held call is inside its started activity: the server dies mid-call
    port, db = server.port, server.db_path
    server.kill()
    stack.gates.disarm("generate")  # the held calls finish while the server is down
    await asyncio.sleep(DOWNTIME_S)  # an outage of this length, not a wait for anything
    server.start()  # same object: same port, same SQLite file
    assert (server.port, server.db_path) == (port, db)

    run = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert (stack.main.pid, stack.trainer.pid) == pids  # the workers were never restarted: they reconnected
    assert stack.main.alive() and stack.trainer.alive()

    # the run finished every step, in order, on the same data order
    assert [h.step for h in run.history] == [1, 2]
    assert in_flight in step1
    trained = await decoded_inputs(client, handle, "train_step", TrainStepInput)
    assert [t.step for t in trained] == [1, 2]
    for t in trained:
        assert t.row_keys == sorted(f"rows/{eid}.parquet" for eid in expected_episode_ids(cfg, t.step))

    # every episode exists exactly once (one execution per deterministic id, no extra ids)
    expected = expected_episode_ids(cfg, 1) + expected_episode_ids(cfg, 2)
    ids = await wait_until(
        lambda: _listed(client, cfg.run_id, len(expected)),
        STATE_WAIT,
        "visibility to list every episode of the run",
    )
    assert sorted(ids) == sorted(expected)
    # in-flight episodes finished: a call lost with the server may be discarded and retried, never missing
    for eid in expected:
        res = await client.get_workflow_handle(eid, result_type=EpisodeResult).result()
        assert res.status == "ok" and res.counts["selected"] == SCENARIO_CALLS - SUMMARY_CALLS, (
            eid,
            res.counts,
        )
        assert res.counts["auxiliary"] == SUMMARY_CALLS, (eid, res.counts)
        assert set(res.counts) <= {"selected", "auxiliary", "discarded"}, (eid, res.counts)
        print(f"{eid}: {res.counts}")

    # nothing trained twice: one train_step completion per step, none a reuse; one COMMIT per step
    results = await activity_results(client, handle, "train_step", TrainStepResult)
    assert [(r.step, r.reused_checkpoint) for r in results] == [(1, False), (2, False)]
    assert await activity_attempts(handle, "train_step") == [1, 1]
    store = LocalStore(stack.store_dir)
    commits = [k for k in store.list(f"checkpoints/{cfg.run_id}/") if k.endswith("/COMMIT")]
    assert commits == [f"checkpoints/{cfg.run_id}/step-00000{s}/COMMIT" for s in (1, 2)]
    for record in run.history:
        assert record.metrics["rollouts"] == GROUP_SIZE * TASKS_PER_STEP
        assert record.episodes == GROUP_SIZE * TASKS_PER_STEP and record.failed_episodes == 0

    # no call twice in any episode's rows, and what was trained is what the rows hold
    for t in trained:
        rows = [row for key in t.row_keys for row in rows_from_parquet(store.get(key))]
        for eid in expected_episode_ids(cfg, t.step):
            calls = [s.call_id for row in rows if row.episode_id == eid for s in row.spans]
            assert calls and len(calls) == len(set(calls)), (eid, calls)
        assert sum(r.num_loss_tokens for r in rows) == run.history[t.step - 1].metrics["loss_tokens"]


async def _listed(client, run_id: str, want: int) -> list[str] | None:
    ids = await workflow_ids_of_run(client, run_id, "EpisodeWorkflow")
    return ids if len(ids) >= want else None
