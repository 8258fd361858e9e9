"""Asynchronous GRPO (max_policy_lag 1) on two engines; an engine and the trainer SIGKILLed in the overlap.

The stack: a dev server, `main` (episodes, io), `trainer`, and two inference workers `e1`, `e2` on the
run's one inference queue, each with its own test gates. The moment is created, never waited for:

- every engine holds each finished generation of step 2 (gate `generate`), so step 2's episodes stand
  still with their first call in flight on some engine;
- the trainer holds step 1's checkpoint after its first file (gate `store_put`): step 1 is training.

With both held, step 2 is rolling out while step 1 trains (the overlap k = 1 allows). Then the trainer
and one engine that holds a step-2 call are SIGKILLed; the trainer comes back, the other engine lets its
calls go. The run must finish with:

- each step trained once, on exactly its own episodes (every episode of the step, each once);
- the killed engine's calls re-run as new admissions (`<call>.r1`) on the surviving engine;
- no trained token outside the bound (lag 0..1), and step 2 really trained tokens sampled one version
  behind (the overlap happened);
- the checkpoint versions consistent (1..3 committed, published versions = steps);
- each step's held-out evaluation scored exactly the version it names (every call served by it), while
  later steps rolled out on the same engines.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import pytest

from grove import queues
from grove.contracts import GenerateResult, HarnessSpec, RunConfig, RunResult, RunState
from grove.gates import GateControl
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from grove.store_layout import commit_key
from harnesses import scenario
from infra.worker_process import WorkerProcess, wait_until
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import DurabilityStack, activity_results
from workflows.training_run import TrainingRunWorkflow, step_specs

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

TASKS_PER_STEP, GROUP_SIZE, STEPS = 1, 2, 3
HELD_STEP = 2


@pytest.fixture
async def fleet(tmp_path_factory, tiny_model_dir):
    """A stack whose main worker runs no engine, plus two engine workers with their own gates."""
    s = DurabilityStack(tmp_path_factory.mktemp("async-engines"), tiny_model_dir)
    s.main = s._worker("main", [queues.EPISODES, queues.IO])
    engines = {}
    for name in ("e1", "e2"):
        gates = GateControl(s.root / f"gates-{name}")
        worker = WorkerProcess(
            name, [queues.INFERENCE], address=s.server.address, store_url=s.store_url, model=s.model,
            log_dir=s.root / "logs", extra_env=gates.env,
        )  # fmt: skip
        engines[name] = (worker, gates)
    try:
        yield s, engines
    finally:
        for worker, _ in engines.values():
            worker.stop()
        s.down()


def run_config(model: str) -> RunConfig:
    return RunConfig(
        run_id=f"dur-async-{uuid.uuid4().hex[:6]}", model=model, seed=5, steps=STEPS,
        task_family=scenario.NAME, num_tasks=4, tasks_per_step=TASKS_PER_STEP, group_size=GROUP_SIZE,
        harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
        learner=LearnerConfig(lr=1e-2), max_policy_lag=1, continue_as_new_every=100,
        eval_every=1, eval_tasks=1,
    )  # fmt: skip


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_k1_two_engines_engine_and_trainer_killed_in_the_overlap(fleet):
    stack, engines = fleet
    await stack.up()
    client, store = stack.client, LocalStore(stack.store_dir)
    for worker, gates in engines.values():
        gates.arm("generate", re.escape(f"/s{HELD_STEP:06d}/"))
        worker.start()
    for worker, _ in engines.values():
        await worker.wait_ready(client)
    cfg = run_config(str(stack.model))
    first_ckpt = f"checkpoints/{cfg.run_id}/step-000001/model/config.json"
    stack.gates.arm("store_put", f"^{re.escape(first_ckpt)}$")
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip

    async def overlap() -> dict[str, list[str]] | None:
        for worker, _ in engines.values():
            worker.check_alive()
        stack.trainer.check_alive()
        held = {name: gates.held("generate") for name, (_, gates) in engines.items()}
        step2_calls = sum(len(v) for v in held.values())  # one root call per step-2 episode, then blocked
        return held if step2_calls >= TASKS_PER_STEP * GROUP_SIZE and stack.gates.held("store_put") else None

    held = await wait_until(
        overlap, STATE_WAIT, "step 2 held on the engines while step 1 trains", logs=stack.logs()
    )
    # the run's progress shows the overlap: step 1 training, step 2 rolling out one version ahead,
    # and both engines (as they reported when step 1 started training) at version 0
    live = (await handle.query("progress", result_type=RunState)).live
    assert live is not None and (live.training_step, live.rolling_out) == (1, [2]), live
    assert (live.committed_version, live.lag, live.max_policy_lag) == (0, 1, 1), live
    assert len(live.engines) == 2 and {e.version for e in live.engines} == {0}, live.engines
    victim = "e2" if held["e2"] else "e1"
    survivor = "e1" if victim == "e2" else "e2"
    print("held at the kill:", held, "killing", victim)
    engines[victim][0].kill()
    stack.trainer.kill()
    engines[survivor][1].disarm("generate")  # the survivor's calls (and the re-runs) go through
    stack.gates.disarm("store_put")
    stack.trainer.start()
    await stack.trainer.wait_ready(client)

    run = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert [h.step for h in run.history] == [1, 2, 3]
    assert [h.policy_version for h in run.history] == [1, 2, 3]

    state = RunState(config=cfg)
    for h in run.history:
        # each step trained once, on exactly its own episodes: every one, each once
        expected = sorted(s.episode_id for s in step_specs(state, h.step))
        trained = sorted(json.loads(store.get(f"checkpoints/{cfg.run_id}/step-{h.step:06d}/episodes.json")))
        assert trained == expected, (h.step, trained)
        assert h.metrics["rollouts"] == TASKS_PER_STEP * GROUP_SIZE and h.failed_episodes == 0
        assert store.exists(commit_key(cfg.run_id, h.step))
        # the staleness bound held for every trained token
        assert 0 <= h.metrics["lag_max"] <= 1, h.metrics
        # the evaluation after step N is of version N, and only version N served its calls
        assert h.eval is not None and h.eval.failed_episodes == 0, h.eval
        assert (h.eval.policy_version, h.eval.served_versions) == (h.step, [h.step]), h.eval
    # step 2 rolled out on version 0 while step 1 trained: it trained tokens one version behind
    assert run.history[HELD_STEP - 1].metrics.get("lag_tokens_1", 0) > 0, run.history[1].metrics

    # the killed engine's held calls were lost attempts, re-admitted and served (by the survivor)
    for key in held[victim]:
        episode, call, _attempt = key.rsplit("/", 2)
        child = client.get_workflow_handle(episode)
        served = [r.call_id for r in await activity_results(client, child, "generate", GenerateResult)]
        assert f"{call}.r1" in served and call not in served, (key, served)
    # and the survivor's own held calls completed as they were (no re-run)
    for key in held[survivor]:
        episode, call, _attempt = key.rsplit("/", 2)
        child = client.get_workflow_handle(episode)
        served = [r.call_id for r in await activity_results(client, child, "generate", GenerateResult)]
        assert call in served and f"{call}.r1" not in served, (key, served)
