"""A run's GRPO group keeps every episode, however it ended.

Real services: the Temporal dev server, one in-process grove worker on every queue, vLLM on the tiny
model, a local object store. The `group-outcomes` program (harnesses/scenario.py) ends episodes
differently by index in group: 0 makes only an auxiliary call (valid, zero rows), 3 breaks a harness
rule (a policy failure), the others make one action call. One child is terminated mid-generation at a
moment the test creates: an engine-side gate holds that episode's generation until the test has
terminated the child, so nothing here races with time.

Expected advantages are written out from the formula with the episodes' own rewards (statistics.stdev
is the sample std), never through trainer/advantages.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from grove import queues
from grove.contracts import EpisodeResult, HarnessSpec, RunConfig, RunResult, RunState
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from grove.store_layout import episodes_key
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT
from trainer.rows import rows_from_parquet
from workflows.training_run import TrainingRunWorkflow, step_specs

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]


def config(model: str, group_size: int, learner: LearnerConfig) -> RunConfig:
    return RunConfig(
        run_id=f"outcomes-{uuid.uuid4().hex[:6]}", model=model, steps=1, task_family=scenario.NAME,
        num_tasks=4, tasks_per_step=1, group_size=group_size,
        harness=HarnessSpec(program=scenario.OUTCOMES_NAME), sampling=SamplingConfig(max_tokens=6),
        learner=learner,
    )  # fmt: skip


def expected_advantages(baseline: dict[str, float], eps: float) -> dict[str, float]:
    mean = sum(baseline.values()) / len(baseline)
    std = statistics.stdev(baseline.values())
    return {e: (r - mean) / (std + eps) for e, r in baseline.items()}


@contextlib.asynccontextmanager
async def generation_held(engine, episode_id: str):
    """Holds every generation of `episode_id` on the engine until `release` is set or the block ends;
    `entered` is set once one is held (the moment the test acts on, created rather than awaited)."""
    entered, release = asyncio.Event(), asyncio.Event()
    real_generate = engine.generate

    async def gated_generate(prompt_ids, sampling, seed, request_id):
        if request_id.startswith(episode_id + "/"):
            entered.set()
            await release.wait()
        return await real_generate(prompt_ids, sampling, seed, request_id)

    engine.generate = gated_generate
    try:
        yield entered, release
    finally:
        release.set()
        engine.generate = real_generate


async def results(client, cfg: RunConfig, ids: list[str]) -> dict[str, EpisodeResult]:
    return {e: await client.get_workflow_handle(e, result_type=EpisodeResult).result() for e in ids}


async def test_zero_row_episode_counts_in_its_group_at_run_level(
    temporal_client, grove_worker, e2e_store, tiny_model_dir
):
    learner = LearnerConfig(lr=1e-3, rollouts_per_step=3)  # refuses a batch that lost an episode
    cfg = config(str(tiny_model_dir), 3, learner)
    ids = [s.episode_id for s in step_specs(RunState(config=cfg), 1)]
    run: RunResult = await temporal_client.execute_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES
    )
    record = run.history[0]
    assert (record.episodes, record.failed_episodes, record.excluded_episodes) == (3, 0, 0)
    m = record.metrics
    assert (m["rollouts"], m["baseline_rollouts"], m["valid_rollouts"], m["rowless_rollouts"]) == (3, 3, 3, 1)
    assert m["loss_tokens"] > 0 and m["skipped"] == 0.0

    by_id = await results(temporal_client, cfg, ids)
    aux_only = by_id[ids[scenario.AUX_ONLY_INDEX]]
    assert (aux_only.status, aux_only.num_rows, aux_only.counts) == ("ok", 0, {"auxiliary": 1})
    assert rows_from_parquet(e2e_store.get(aux_only.rows_key)) == []  # a valid, readable, empty file
    assert all(by_id[e].num_rows == 1 for e in ids[1:])

    saved = json.loads(e2e_store.get(episodes_key(cfg.run_id, 1)))
    want = expected_advantages({e: by_id[e].reward for e in ids}, learner.adv_eps)
    assert len(set(want.values())) == 3  # distinct rewards: a wrong baseline would show
    for e in ids:
        assert saved[e]["advantage"] == pytest.approx(want[e], rel=1e-9, abs=1e-12)


async def test_run_survives_a_terminated_child_and_keeps_a_policy_failure_in_the_baseline(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir
):
    learner = LearnerConfig(lr=1e-3, rollouts_per_step=5, failure_reward=-1.0)
    cfg = config(str(tiny_model_dir), 5, learner)
    ids = [s.episode_id for s in step_specs(RunState(config=cfg), 1)]
    doomed = ids[4]
    # hold this episode's generation until the test acted
    async with generation_held(recording_engine, doomed) as (entered, release):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
            result_type=RunResult,
        )  # fmt: skip
        await entered.wait()  # the child exists and is mid-call
        await temporal_client.get_workflow_handle(doomed).terminate(reason="test: a lost episode")
        release.set()
        run = await handle.result()

    record = run.history[0]
    assert (record.episodes, record.failed_episodes, record.excluded_episodes) == (5, 2, 1)
    assert record.failures_by_kind == {"infrastructure": 1, "policy": 1}
    m = record.metrics
    assert (m["rollouts"], m["baseline_rollouts"], m["excluded_rollouts"]) == (5, 4, 1)
    assert (m["policy_failed_rollouts"], m["infrastructure_failed_rollouts"]) == (1, 1)
    assert m["valid_rollouts"] == 3

    by_id = await results(temporal_client, cfg, ids[:4])
    failed = by_id[ids[scenario.POLICY_FAILURE_INDEX]]
    assert (failed.status, failed.failure_kind) == ("failed", "policy")
    assert "NativeHarnessError" in (failed.failure or "")
    saved = json.loads(e2e_store.get(episodes_key(cfg.run_id, 1)))
    baseline = {e: by_id[e].reward for e in ids[:3]} | {failed.episode_id: -1.0}
    want = expected_advantages(baseline, learner.adv_eps)
    for e in ids[:3]:
        assert saved[e]["advantage"] == pytest.approx(want[e], rel=1e-9, abs=1e-12)
    assert saved[failed.episode_id]["in_baseline"] and saved[failed.episode_id]["advantage"] == 0.0
    assert not saved[doomed]["in_baseline"] and saved[doomed]["failure_kind"] == "infrastructure"


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_a_child_that_never_finishes_times_out_and_the_step_goes_on(
    temporal_client, grove_worker, recording_engine, tiny_model_dir
):
    """RunConfig.episode_timeout_s is enforced by the server: a child that cannot finish (here its one
    generation is held by the test until the run has ended; a child whose workflow tasks fail on every
    attempt is the same to the server) times out, and its step trains on the others."""
    bound_s = 60.0  # the two free children finish in seconds; the held one can only time out
    cfg = config(str(tiny_model_dir), 3, LearnerConfig(lr=1e-3)).model_copy(
        update={"episode_timeout_s": bound_s}
    )
    ids = [s.episode_id for s in step_specs(RunState(config=cfg), 1)]
    stuck = ids[2]
    async with generation_held(recording_engine, stuck) as (entered, _release):
        handle = await temporal_client.start_workflow(
            TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
            result_type=RunResult,
        )  # fmt: skip
        await entered.wait()
        run = await handle.result()  # returns only if the held child stopped holding the step

    child = await temporal_client.get_workflow_handle(stuck).describe()
    assert child.status == WorkflowExecutionStatus.TIMED_OUT
    assert (child.close_time - child.start_time).total_seconds() >= bound_s - 1  # the server's own clocks
    record = run.history[0]
    assert (record.episodes, record.failed_episodes, record.excluded_episodes) == (3, 1, 1)
    assert record.failures_by_kind == {"infrastructure": 1}
    assert record.metrics["valid_rollouts"] == 2
    by_id = await results(temporal_client, cfg, ids[:2])
    assert all(r.status == "ok" for r in by_id.values())
