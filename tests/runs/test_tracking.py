"""Experiment tracking: the step's scalars, and TensorBoard event files that a retry never duplicates.

The activity function runs for real here (no Temporal needed to call it); the files are read back with
TensorBoard's own loader.
"""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from activities.tracking import event_file, track_step
from grove.contracts import EpisodeResult, EvalRecord, StepRecord, TrackingConfig, TrackStepInput
from workflows.step_metrics import rollout_metrics, step_scalars


def result(reward: float, calls: int, rows: int, tokens: int, status: str = "ok") -> EpisodeResult:
    return EpisodeResult(
        episode_id="e", group_id="g", task_id="t", status=status, reward=reward, rows_key="k",
        num_rows=rows, eligible_tokens=tokens, counts={"selected": calls - 1, "discarded": 1},
    )  # fmt: skip


def test_rollout_metrics_over_the_ok_episodes():
    got = rollout_metrics(
        [result(1.0, 4, 3, 10), result(0.0, 6, 1, 20), result(0.7, 9, 9, 9, status="failed")]
    )
    assert got == {"reward_std": 0.5, "calls_per_episode": 5.0, "rows_per_episode": 2.0,
                   "eligible_tokens_per_episode": 15.0}  # fmt: skip
    assert rollout_metrics([result(0.0, 1, 1, 1, status="failed")]) == {}


def record(step: int, reward: float, with_eval: bool = False) -> StepRecord:
    return StepRecord(
        step=step, mean_reward=reward, episodes=8, failed_episodes=1, policy_version=step,
        metrics={"loss": -0.25, "grad_norm": 3.0}, reward_components={"parent": 0.5},
        rollout={"reward_std": 0.125, "calls_per_episode": 5.0}, timings={"rollout_s": 12.5},
        eval=EvalRecord(policy_version=step, mean_reward=0.375, episodes=4, failed_episodes=0,
                        reward_components={"workers": 0.25}) if with_eval else None,
    )  # fmt: skip


def test_step_scalars_tag_every_number_of_the_record():
    assert step_scalars(record(3, 0.75, with_eval=True)) == {
        "episodes/failed": 1.0, "episodes/total": 8.0, "eval/failed_episodes": 0.0,
        "eval/mean_reward": 0.375, "eval/policy_version": 3.0, "eval/workers": 0.25,
        "learner/grad_norm": 3.0, "learner/loss": -0.25,
        "policy_version": 3.0, "reward/mean": 0.75, "reward/parent": 0.5, "reward/std": 0.125,
        "rollout/calls_per_episode": 5.0, "time/rollout_s": 12.5,
    }  # fmt: skip


def test_a_retried_step_replaces_its_points_instead_of_adding_some(tmp_path):
    tracking = TrackingConfig(dir=str(tmp_path))
    track_step(TrackStepInput(run_id="r", record=record(1, 0.25), tracking=tracking))
    track_step(TrackStepInput(run_id="r", record=record(1, 0.25), tracking=tracking))  # the retry
    out = track_step(TrackStepInput(run_id="r", record=record(2, 0.5, with_eval=True), tracking=tracking))
    assert out.tensorboard_file == str(event_file(tracking, "r", 2))
    files = sorted(p.name for p in (tmp_path / "r" / "tensorboard").iterdir())
    assert files == ["events.out.tfevents.step-000001.grove", "events.out.tfevents.step-000002.grove"]
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("eval/mean_reward")] == [(2, 0.375)]
    assert [(e.step, e.value) for e in events.Scalars("learner/loss")] == [(1, -0.25), (2, -0.25)]


def test_tensorboard_can_be_switched_off(tmp_path):
    off = TrackingConfig(dir=str(tmp_path), tensorboard=False)
    out = track_step(TrackStepInput(run_id="r", record=record(1, 0.0), tracking=off))
    assert out.tensorboard_file is None and not any(tmp_path.iterdir())


def test_mlflow_without_the_package_is_a_named_non_retryable_error(tmp_path):
    """mlflow is optional and not installed here: asking for it must say so, not fail obscurely."""
    from temporalio.exceptions import ApplicationError

    ml = TrackingConfig(dir=str(tmp_path), mlflow_uri="file:///tmp/ml")
    with pytest.raises(ApplicationError, match="mlflow is not installed on this io worker") as err:
        track_step(TrackStepInput(run_id="r", record=record(1, 0.0), tracking=ml))
    assert err.value.non_retryable and err.value.type == "MlflowMissingError"
