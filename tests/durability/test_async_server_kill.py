"""Asynchronous GRPO (max_policy_lag 1): SIGKILL the Temporal dev server in the overlap, restart it on the
same port and SQLite file, and the run finishes with nothing lost and nothing trained twice.

The moment is created with gates, never waited for: the engine (the `main` worker) holds each finished
generation of step 2 (gate `generate`), and the trainer holds step 1's checkpoint after its first file
(gate `store_put`). With both held, step 2 rolls out on version 0 while step 1 trains: the overlap k = 1
allows. Step 2's calls are then let go and its episodes are held again where they write their rows
(gate `store_put`): every token of step 2 is sampled and recorded at version 0, before the outage. The
server is SIGKILLed there, the store gate is released while it is down (step 1's checkpoint commits and
step 2's episodes materialize against a dead server), and it is restarted. No worker is restarted: they
reconnect by themselves.

Why step 2's calls finish before the kill, not during the outage: a generation completed while the
server is down survives only if the server comes back within the generate heartbeat timeout (20 s);
on a loaded machine the restart alone can take longer, the attempt is then lost and re-run at version
1 (correct, and covered by the worker-kill tests), and step 2 would train no lag-1 token. The rows
write held across the outage is idempotent whichever way its attempt ends. The run must finish with:

- each step trained exactly once, on exactly its own episodes (one COMMIT per step, the checkpoint's
  episode list = the step's documented episode ids), whatever the trainer activity had to redo;
- every episode of the run existing once and finishing ok;
- no trained token outside the bound (lag 0..1), and step 2 trained tokens sampled one version behind
  (the overlap really happened across the outage).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import pytest

from grove import queues
from grove.contracts import HarnessSpec, RunConfig, RunResult, RunState
from grove.data_order import task_indices
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from grove.store_layout import commit_key
from harnesses import scenario
from infra.worker_process import wait_until
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import wait_held, workflow_ids_of_run
from workflows.training_run import TrainingRunWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

TASKS_PER_STEP, GROUP_SIZE, NUM_TASKS, SEED, STEPS = 1, 2, 4, 11, 3
HELD_STEP = 2
DOWNTIME_S = 3.0  # long enough for every worker poll and in-flight completion to fail


def run_config(model: str) -> RunConfig:
    return RunConfig(
        run_id=f"dur-async-server-{uuid.uuid4().hex[:6]}", model=model, seed=SEED, steps=STEPS,
        task_family=scenario.NAME, num_tasks=NUM_TASKS, tasks_per_step=TASKS_PER_STEP, group_size=GROUP_SIZE,
        harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
        learner=LearnerConfig(lr=1e-2), max_policy_lag=1, continue_as_new_every=100,
    )  # fmt: skip


def expected_episode_ids(cfg: RunConfig, step: int) -> list[str]:
    """Written from the documented id scheme {run}/s{step:06d}/t{task}/g{j}, not from the workflow."""
    tasks = task_indices(cfg.seed, step, cfg.tasks_per_step, cfg.num_tasks)
    return sorted(f"{cfg.run_id}/s{step:06d}/t{t}/g{j}" for t in tasks for j in range(cfg.group_size))


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_k1_server_sigkill_in_the_overlap_resumes_on_the_same_database(stack):
    await stack.up()
    client, server = stack.client, stack.server
    cfg = run_config(str(stack.model))
    pids = (stack.main.pid, stack.trainer.pid)
    first_ckpt = f"checkpoints/{cfg.run_id}/step-000001/model/config.json"
    for point in ("generate", "store_put"):
        stack.gates.clear(point)
    step_prefix = f"{re.escape(cfg.run_id)}/s{HELD_STEP:06d}/"
    stack.gates.arm("generate", f"^{step_prefix}")
    # step 1's checkpoint, then (once step 2's calls are let go) each step-2 episode's rows
    stack.gates.arm("store_put", f"^{re.escape(first_ckpt)}$|^rows/{step_prefix}")
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip
    await wait_held(stack, "store_put", 1, "step 1's checkpoint held half-written")
    await wait_held(stack, "generate", 1, "a step-2 call held on the engine while step 1 trains")
    live = (await handle.query("progress", result_type=RunState)).live
    assert live is not None and (live.training_step, live.rolling_out) == (1, [2]), live
    stack.gates.disarm("generate")  # step 2's calls finish on version 0: step 1's checkpoint is held
    held = await wait_held(
        stack, "store_put", 1 + TASKS_PER_STEP * GROUP_SIZE, "step 2's episodes writing their rows"
    )
    assert sum(k.startswith("rows/") for k in held) == TASKS_PER_STEP * GROUP_SIZE, held

    port, db = server.port, server.db_path
    server.kill()
    stack.gates.disarm("store_put")  # step 1's checkpoint commits and step 2's rows land while it is down
    await asyncio.sleep(DOWNTIME_S)  # an outage of this length, not a wait for anything
    server.start()  # same object: same port, same SQLite file
    assert (server.port, server.db_path) == (port, db)

    run = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert (stack.main.pid, stack.trainer.pid) == pids  # the workers were never restarted
    assert [h.step for h in run.history] == [1, 2, 3]
    assert [h.policy_version for h in run.history] == [1, 2, 3]

    store = LocalStore(stack.store_dir)
    commits = [k for k in store.list(f"checkpoints/{cfg.run_id}/") if k.endswith("/COMMIT")]
    assert commits == [commit_key(cfg.run_id, s) for s in (1, 2, 3)]
    for h in run.history:
        # trained once, on exactly its own episodes: every one, each once
        trained = sorted(json.loads(store.get(f"checkpoints/{cfg.run_id}/step-{h.step:06d}/episodes.json")))
        assert trained == expected_episode_ids(cfg, h.step), (h.step, trained)
        assert h.metrics["rollouts"] == TASKS_PER_STEP * GROUP_SIZE and h.failed_episodes == 0, h
        assert 0 <= h.metrics["lag_max"] <= 1, h.metrics
    # step 2 rolled out on version 0 while step 1 trained, across the outage: lag-1 tokens trained
    assert run.history[HELD_STEP - 1].metrics.get("lag_tokens_1", 0) > 0, run.history[HELD_STEP - 1].metrics

    # every episode exists exactly once (one execution per deterministic id, no extra ids)
    expected = sorted(eid for s in range(1, STEPS + 1) for eid in expected_episode_ids(cfg, s))

    async def listed() -> list[str] | None:
        ids = await workflow_ids_of_run(client, cfg.run_id, "EpisodeWorkflow")
        return ids if len(ids) >= len(expected) else None

    ids = await wait_until(listed, STATE_WAIT, "visibility to list every episode of the run")
    assert sorted(ids) == expected
