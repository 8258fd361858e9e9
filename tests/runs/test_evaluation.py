"""Held-out evaluation: which tasks, which episodes, how they are recorded (pure: no services)."""

from __future__ import annotations

import pytest

from grove.contracts import EpisodeResult, PolicyRef, RunConfig, RunState
from grove.sampling import SamplingConfig
from workflows.evaluation import HeldOutOverlapError, eval_record, eval_specs, evaluates_at
from workflows.training_run import step_specs


def test_held_out_tasks_follow_the_training_range_in_order_with_their_own_sampling():
    cfg = RunConfig(run_id="r", num_tasks=10, eval_tasks=3, eval_every=2,
                    eval_sampling=SamplingConfig(temperature=0.5, max_tokens=3))  # fmt: skip
    specs = eval_specs(cfg, 4)
    assert [s.task.task_id for s in specs] == ["delegation-10", "delegation-11", "delegation-12"]
    assert [s.episode_id for s in specs] == [f"r/eval/s000004/t{t}/g0" for t in (10, 11, 12)]
    assert all(s.sampling == SamplingConfig(temperature=0.5, max_tokens=3) for s in specs)
    assert eval_specs(cfg, 4) == specs  # a fixed set: the same at every call (and every step but the ids)
    assert [s.task for s in eval_specs(cfg, 6)] == [s.task for s in specs]
    # disjoint from every task the run trains on, whatever the step
    train_tasks = {s.task.task_id for step in range(1, 6) for s in step_specs(RunState(config=cfg), step)}
    assert train_tasks <= {f"delegation-{i}" for i in range(10)}
    # without eval_sampling the episodes sample like training
    plain = RunConfig(run_id="r", sampling=SamplingConfig(max_tokens=5), eval_every=1)
    assert eval_specs(plain, 1)[0].sampling == SamplingConfig(max_tokens=5)


def test_evaluation_steps():
    cfg = RunConfig(run_id="r", eval_every=3)
    assert [s for s in range(1, 10) if evaluates_at(cfg, s)] == [3, 6, 9]
    assert not any(evaluates_at(RunConfig(run_id="r"), s) for s in range(1, 10))  # default: never


def test_a_family_that_repeats_tasks_cannot_hide_a_training_task_in_the_held_out_set():
    # delegation has 16 * 15 = 240 distinct word pairs: index 240 is index 0's pair again
    cfg = RunConfig(run_id="r", num_tasks=240, eval_tasks=1, eval_every=1)
    with pytest.raises(HeldOutOverlapError, match="delegation-240 of family 'delegation' repeats"):
        eval_specs(cfg, 1)
    eval_specs(cfg.model_copy(update={"num_tasks": 239}), 1)  # 239 is still a new pair


def result(eid: str, reward: float, status: str = "ok", **details: float) -> EpisodeResult:
    return EpisodeResult(
        episode_id=eid, group_id="g", task_id="t", status=status, reward=reward, rows_key="k",
        num_rows=1, eligible_tokens=1, counts={}, reward_details=details,
    )  # fmt: skip


def test_the_eval_record_averages_ok_episodes_and_counts_the_rest_as_failed():
    rec = eval_record(
        7,
        [result("a", 0.5, parent=1.0, workers=0.0), result("b", 0.25, parent=0.5, workers=0.0),
         result("c", 0.9, status="failed"), None],
    )  # fmt: skip
    assert (rec.policy_version, rec.episodes, rec.failed_episodes) == (7, 4, 2)
    assert rec.mean_reward == 0.375
    assert rec.reward_components == {"parent": 0.75, "workers": 0.0}
    assert eval_record(1, [None]).mean_reward == 0.0


def test_an_evaluation_is_pinned_to_its_steps_version_whatever_the_runs_lag():
    # an overlapped run (k = 2) may have committed newer versions while step 4 is evaluated
    cfg = RunConfig(run_id="r", num_tasks=10, eval_tasks=2, eval_every=2, max_policy_lag=2)
    for spec in eval_specs(cfg, 4):
        assert spec.policy is not None and (spec.policy.min_version, spec.policy.max_version) == (4, 4)
    # training episodes of the same run are not capped: they take the newest committed version
    assert all(s.policy.max_version is None for s in step_specs(RunState(config=cfg), 5))


def test_the_eval_record_lists_the_versions_that_served_its_calls():
    a = result("a", 0.5).model_copy(update={"policy_versions": [3]})
    b = result("b", 0.1, status="failed").model_copy(update={"policy_versions": [3, 4]})
    assert eval_record(3, [a, None]).served_versions == [3]
    assert eval_record(3, [a, b, None]).served_versions == [3, 4]  # shows a mixed evaluation as such


def test_a_policy_ref_whose_cap_is_below_its_floor_is_refused_naming_the_run():
    with pytest.raises(ValueError, match="run 'r': max_version 2 < min_version 3"):
        PolicyRef(run_id="r", min_version=3, max_version=2)
