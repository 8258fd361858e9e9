"""The acceptance episode on real services (Temporal dev server, vLLM on the tiny model, object store).

A parent; two workers whose calls overlap; worker-1 compacts mid-way and so finishes after worker-2;
the parent resumes after both answer. Run through TrainingRunWorkflow (2 steps, one group of 2
episodes per step), then checked against the calls the engine actually served:
exact conditioning, tokens, masks and behaviour logprobs of every row; complete accounting;
once-only loss; one logical-rollout contribution per episode to the GRPO baseline; loss and gradient
agreement with the independent per-call reference; a real learner step on worker actions whose
checkpoint is published, so step 2's calls report policy version 1.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch

from bench.forests import Call, Episode
from grove import queues
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec, RunConfig, RunResult, RunState
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.inference.reference import learner_logprobs
from tests.learner.test_reference import learner_loss, per_call_reference
from trainer.advantages import episode_advantages
from trainer.checkpoint import latest_committed_step
from trainer.learner import load_policy
from trainer.rows import Row, rows_from_parquet
from workflows.training_run import TrainingRunWorkflow, step_specs

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SAMPLING = SamplingConfig(max_tokens=10)
LEARNER = LearnerConfig(lr=1e-3)

# The scenario's calls (harnesses/scenario.py), written out: context -> call ids in order.
ALL_CALLS = {
    "parent.0.c0", "parent.0.c1",
    "worker-1.0.c0", "worker-1.0.c1", "worker-1.0.c2",  # c2 is the compaction's summary call
    "worker-1.1.c0",  # after the declared rewrite
    "worker-2.0.c0",
}  # fmt: skip
COUNTS = {"selected": len(ALL_CALLS) - 1, "auxiliary": 1}  # the summary call settles auxiliary
# Rows: one per endpoint; each eligible call owned by exactly one row (its only descendant endpoint).
EXPECTED_ROWS = {
    "parent.0.c1": ["parent.0.c0", "parent.0.c1"],
    "worker-1.0.c2": ["worker-1.0.c0", "worker-1.0.c1", "worker-1.0.c2"],
    "worker-1.1.c0": ["worker-1.1.c0"],
    "worker-2.0.c0": ["worker-2.0.c0"],
}


def run_config(train_agents: str, steps: int) -> RunConfig:
    return RunConfig(
        run_id=f"accept-{train_agents}-{uuid.uuid4().hex[:6]}",
        model="",  # set by the test (the tiny model folder)
        steps=steps,
        task_family=scenario.NAME,
        num_tasks=4,
        tasks_per_step=1,
        group_size=2,
        harness=HarnessSpec(program=scenario.NAME),
        sampling=SAMPLING,
        train_agents=train_agents,
        train_auxiliary=["summary"],  # worker-1's summary call is trained like its actions
        learner=LEARNER,
    )


async def run_training(client, cfg: RunConfig) -> RunResult:
    return await client.execute_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES
    )


async def episode_result(client, spec: EpisodeSpec) -> EpisodeResult:
    return await client.get_workflow_handle(spec.episode_id, result_type=EpisodeResult).result()


async def generate_timeline(client, episode_id: str) -> tuple[dict[str, int], dict[str, int]]:
    """call id -> event id of its generate activity's scheduling and completion, from the history."""
    history = await client.get_workflow_handle(episode_id).fetch_history()
    scheduled, by_event = {}, {}
    completed = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "generate":
                call_id = json.loads(attrs.input.payloads[0].data)["call_id"]
                scheduled[call_id], by_event[event.event_id] = event.event_id, call_id
        elif event.HasField("activity_task_completed_event_attributes"):
            call_id = by_event.get(event.activity_task_completed_event_attributes.scheduled_event_id)
            if call_id is not None:
                completed[call_id] = event.event_id
    return scheduled, completed


def grads_relative(grads: dict, ref_grads: dict) -> float:
    """max over parameters of ||g - g_ref||_2 / ||g_ref||_2."""
    worst = 0.0
    for name, g in ref_grads.items():
        scale = float(g.norm())
        assert scale > 0, f"reference gradient of {name} is zero: the comparison would prove nothing"
        worst = max(worst, float((grads[name] - g).norm()) / scale)
    return worst


def endpoint_of(row: Row) -> str:
    return row.spans[-1].call_id


def check_row_against_served(row: Row, served: dict) -> None:
    end = served[endpoint_of(row)]
    np.testing.assert_array_equal(row.input_ids, np.concatenate([end.prompt_ids, end.completion_ids]))
    expected_mask = np.zeros(row.input_ids.size, dtype=bool)
    expected_lp = np.zeros(row.input_ids.size, dtype=np.float32)
    for span in row.spans:
        s = served[span.call_id]
        # exact conditioning: everything before the call's completion is exactly the prompt it was served
        np.testing.assert_array_equal(row.input_ids[: span.start], s.prompt_ids)
        np.testing.assert_array_equal(row.input_ids[span.start : span.end], s.completion_ids)
        if span.owned:
            expected_mask[span.start : span.end] = True
            expected_lp[span.start : span.end] = s.logprobs
    np.testing.assert_array_equal(row.loss_mask, expected_mask)
    np.testing.assert_array_equal(row.behavior_logprobs, expected_lp)


def as_reference_episode(result: EpisodeResult, served: dict, parent_only: bool) -> Episode:
    """The episode as the engine served it, for the per-call reference (no row code involved)."""
    calls = [
        Call(
            call_id=cid,
            agent=cid.split(".")[0],
            context_id=cid.rsplit(".", 1)[0],
            parent_call_id=None,
            prompt=s.prompt_ids,
            completion=s.completion_ids,
            logprobs=s.logprobs,
            selected=not parent_only or cid.startswith("parent."),
        )  # fmt: skip
        for cid, s in sorted(served.items())
    ]
    return Episode(episode_id=result.episode_id, group_id=result.group_id, reward=result.reward, calls=calls)


async def test_acceptance_episode_trains_worker_actions_and_publishes(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir
):
    cfg = run_config("all", steps=2).model_copy(update={"model": str(tiny_model_dir)})
    run = await run_training(temporal_client, cfg)
    assert [h.step for h in run.history] == [1, 2]

    state = RunState(config=cfg)
    step1 = step_specs(state, 1)
    results = [await episode_result(temporal_client, spec) for spec in step1]
    all_rows: list[Row] = []
    for spec, result in zip(step1, results, strict=True):
        served = recording_engine.calls_of(spec.episode_id)
        assert set(served) == ALL_CALLS  # nothing lost, nothing extra
        assert result.status == "ok" and result.counts == COUNTS
        # the workers' calls were outstanding at the same time, and worker-2 answered before worker-1
        scheduled, completed = await generate_timeline(temporal_client, spec.episode_id)
        first_worker_done = min(completed["worker-1.0.c0"], completed["worker-2.0.c0"])
        assert max(scheduled["worker-1.0.c0"], scheduled["worker-2.0.c0"]) < first_worker_done
        assert completed["worker-2.0.c0"] < completed["worker-1.1.c0"]
        assert all(s.policy_version == 0 for s in served.values())

        rows = rows_from_parquet(e2e_store.get(result.rows_key))
        assert {endpoint_of(r): [s.call_id for s in r.spans] for r in rows} == EXPECTED_ROWS
        for row in rows:
            assert all(s.owned for s in row.spans)  # here every call has exactly one endpoint
            check_row_against_served(row, served)
            assert row.reward == result.reward and row.episode_id == spec.episode_id
        # the workers' answers came back into the parent as observations: no loss on them
        parent_row = next(r for r in rows if endpoint_of(r) == "parent.0.c1")
        c0, c1 = parent_row.spans
        assert c1.start - c0.end > 0 and not parent_row.loss_mask[c0.end : c1.start].any()
        owned = [s.call_id for r in rows for s in r.spans if s.owned]
        assert sorted(owned) == sorted(ALL_CALLS)  # once-only loss
        assert sum(r.num_loss_tokens for r in rows) == sum(s.completion_ids.size for s in served.values())
        all_rows += rows

    # one logical-rollout contribution per episode, whatever its number of rows (4 each)
    r1, r2 = (r.reward for r in results)
    mean, std = (r1 + r2) / 2, abs(r1 - r2) / np.sqrt(2)  # sample std of two values
    adv = episode_advantages(all_rows, std_scaling=LEARNER.adv_std_scaling, eps=LEARNER.adv_eps)
    for result, r in zip(results, (r1, r2), strict=True):
        assert adv[result.episode_id].advantage == pytest.approx(
            (r - mean) / (std + LEARNER.adv_eps), abs=1e-9
        )

    # loss and every gradient agree with the per-call reference built from the served calls
    policy = load_policy(tiny_model_dir, torch.device("cpu"), trainable=True)
    episodes = [
        as_reference_episode(res, recording_engine.calls_of(res.episode_id), False) for res in results
    ]
    ref_loss, ref_grads = per_call_reference(policy, episodes, LEARNER)
    loss, grads = learner_loss(policy, all_rows, LEARNER)
    # With ratio ~1 and two episodes of equal length, +A and -A cancel: the loss itself is ~1e-8, so
    # it is compared on the scale of one token's surrogate (|A|); every gradient relatively.
    scale = max(abs(a.advantage) for a in adv.values())
    assert abs(loss - ref_loss) <= 1e-6 * max(abs(ref_loss), scale)
    # Per-parameter ||g - g_ref|| / ||g_ref||. On this 1M-param model the two episodes' +A/-A gradients
    # largely cancel, which lifts float32 rounding near 1e-6 relative; real bugs move it by orders of
    # magnitude more (tests/learner/test_reference.py injects them), so 2e-6 still separates the two
    # cleanly.
    assert grads_relative(grads, ref_grads) <= 2e-6

    # the learner step trained on worker actions, its checkpoint is committed and published
    first = run.history[0]
    worker_tokens = sum(r.num_loss_tokens for r in all_rows if endpoint_of(r).startswith("worker-"))
    assert worker_tokens > 0 and first.metrics["loss_tokens"] == sum(r.num_loss_tokens for r in all_rows)
    assert latest_committed_step(e2e_store, cfg.run_id) == 2
    for spec in step_specs(state, 2):
        served = recording_engine.calls_of(spec.episode_id)
        assert served and all(s.policy_version == 1 for s in served.values())


async def test_parent_only_option_trains_parent_actions_only(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir
):
    cfg = run_config("parent_only", steps=1).model_copy(update={"model": str(tiny_model_dir)})
    run = await run_training(temporal_client, cfg)
    specs = step_specs(RunState(config=cfg), 1)
    results = [await episode_result(temporal_client, spec) for spec in specs]
    all_rows: list[Row] = []
    for spec, result in zip(specs, results, strict=True):
        served = recording_engine.calls_of(spec.episode_id)
        assert set(served) == ALL_CALLS and result.counts == COUNTS
        # the engine served the other run's version 2 before: this run switched it back to its base model
        assert all(s.policy_version == 0 for s in served.values())
        s = served["parent.0.c1"]
        base_logprobs = learner_logprobs(tiny_model_dir, s.prompt_ids, s.completion_ids)
        assert np.abs(base_logprobs - s.logprobs).max() <= 1e-4
        rows = rows_from_parquet(e2e_store.get(result.rows_key))
        # worker endpoints carry no loss under parent-only, so only the parent's row exists
        assert [endpoint_of(r) for r in rows] == ["parent.0.c1"]
        check_row_against_served(rows[0], served)
        assert rows[0].num_loss_tokens == sum(
            served[c].completion_ids.size for c in ("parent.0.c0", "parent.0.c1")
        )
        assert result.eligible_tokens == rows[0].num_loss_tokens
        all_rows += rows
    assert run.history[0].metrics["loss_tokens"] == sum(r.num_loss_tokens for r in all_rows)

    policy = load_policy(tiny_model_dir, torch.device("cpu"), trainable=True)
    episodes = [as_reference_episode(res, recording_engine.calls_of(res.episode_id), True) for res in results]
    ref_loss, ref_grads = per_call_reference(policy, episodes, LEARNER)
    loss, grads = learner_loss(policy, all_rows, LEARNER)
    adv = episode_advantages(all_rows, std_scaling=LEARNER.adv_std_scaling, eps=LEARNER.adv_eps)
    scale = max(abs(a.advantage) for a in adv.values())
    assert abs(loss - ref_loss) <= 1e-6 * max(abs(ref_loss), scale)
    assert grads_relative(grads, ref_grads) <= 2e-6


async def test_single_agent_with_one_compaction_gives_two_rows(
    temporal_client, grove_worker, recording_engine, e2e_store
):
    from workflows.episode import EpisodeWorkflow

    eid = f"single-{uuid.uuid4().hex[:6]}/s000000/t0/g0"
    spec = EpisodeSpec(
        run_id="single", step=0, group_id="single/g", episode_id=eid, task=scenario.make_task(0),
        harness=HarnessSpec(program=scenario.SINGLE_NAME), sampling=SAMPLING,
    )  # fmt: skip
    result = await temporal_client.execute_workflow(
        EpisodeWorkflow.run, spec, id=eid, task_queue=queues.EPISODES
    )
    served = recording_engine.calls_of(eid)
    # two calls, the summary call (c2), a declared rewrite, two more calls
    assert set(served) == {"parent.0.c0", "parent.0.c1", "parent.0.c2", "parent.1.c0", "parent.1.c1"}
    # the summary call settles auxiliary; not trained (the default), its row still trains c0 and c1
    assert result.status == "ok" and result.counts == {"selected": 4, "auxiliary": 1} and result.num_rows == 2
    # the episode's ledger counted one rewrite context; the scenario offers no tools
    assert result.call_stats == {"tools_offered": 0, "tool_calls_well_formed": 0, "tool_calls_malformed": 0,
                                 "tool_calls_none": 0, "rewrite_contexts": 1, "summary_calls": 1}  # fmt: skip
    rows = rows_from_parquet(e2e_store.get(result.rows_key))
    assert {endpoint_of(r): [s.call_id for s in r.spans] for r in rows} == {
        "parent.0.c2": ["parent.0.c0", "parent.0.c1", "parent.0.c2"],
        "parent.1.c1": ["parent.1.c0", "parent.1.c1"],
    }
    for row in rows:
        check_row_against_served(row, served)
    assert [s.call_id for r in rows for s in r.spans if not s.owned] == ["parent.0.c2"]  # the summary
    # the second segment starts fresh: its root prompt does not extend the first segment's tokens
    first = served["parent.0.c2"]
    seg1 = np.concatenate([first.prompt_ids, first.completion_ids])
    root = served["parent.1.c0"].prompt_ids
    assert not (root.size >= seg1.size and np.array_equal(root[: seg1.size], seg1))
