"""Recorded workflow histories replay through the current workflow code: a change that breaks determinism
(of runs already in flight) fails here.

The histories in histories/ come from real runs on the dev server (record_histories.py says how and when
to re-record them). Replaying needs no server: `temporalio.worker.Replayer` feeds each history to the
workflow code in the same sandbox a worker uses, with the pydantic data converter every grove process
uses, and fails on any command that differs from the recorded one.

The deliberately altered workflows below prove the replay can fail: each is registered under the real
workflow's name and differs by one command, the kind of edit that breaks in-flight workflows.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

# The altered workflows below are defined here, so the sandbox imports this module: pass grove's modules
# through as the real workflow modules do (one class per model inside and outside the sandbox).
with workflow.unsafe.imports_passed_through():
    from grove import queues
    from grove.contracts import EpisodeResult, GenerateResult, RunResult, RunState
    from workflows.episode import EpisodeWorkflow
    from workflows.handover import EpisodeRun
    from workflows.training_run import TrainingRunWorkflow, step_specs

HISTORIES = Path(__file__).parent / "histories"
# file -> (workflow type, workflow id) as record_histories.py records them
RECORDED = {
    "episode_scenario": ("EpisodeWorkflow", "replay/episode/t0/g0"),
    "episode_lost_attempt": ("EpisodeWorkflow", "replay/lost/t0/g0"),
    "training_run": ("TrainingRunWorkflow", "replay-run"),
}


def history(name: str) -> WorkflowHistory:
    _, workflow_id = RECORDED[name]
    return WorkflowHistory.from_json(workflow_id, (HISTORIES / f"{name}.json").read_text())


def event_types(name: str) -> list[str]:
    return [e["eventType"] for e in json.loads((HISTORIES / f"{name}.json").read_text())["events"]]


def scheduled_activities(name: str) -> list[str]:
    events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    key = "activityTaskScheduledEventAttributes"
    return [e[key]["activityType"]["name"] for e in events if key in e]


async def replay(name: str, *workflows: type) -> None:
    replayer = Replayer(workflows=list(workflows), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history(name))


# ---------------------------------------------------------------------------------- the recordings


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_history_is_a_finished_run_of_its_workflow(name):
    types = event_types(name)
    started = json.loads((HISTORIES / f"{name}.json").read_text())["events"][0]
    assert started["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] == RECORDED[name][0]
    assert types[0] == "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"
    assert types[-1] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"


def test_recordings_cover_the_lost_attempt_and_the_child_episodes():
    # the crash-recovery branch: exactly one generate attempt timed out (heartbeat) and was retried
    lost = event_types("episode_lost_attempt")
    assert lost.count("EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT") == 1
    assert "EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT" not in event_types("episode_scenario")
    # 2 steps x 1 task x group of 2 child episodes; each step's train_step followed by publish_weights
    assert event_types("training_run").count("EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED") == 4
    activities = scheduled_activities("training_run")
    assert activities.count("train_step") == 2
    assert all(activities[i + 1] == "publish_weights" for i, a in enumerate(activities) if a == "train_step")


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_recorded_history_replays_on_the_current_workflows(name):
    await replay(name, EpisodeWorkflow, TrainingRunWorkflow)


# ---------------------------------------------------------------------------------- it can fail


@workflow.defn(name="EpisodeWorkflow")
class EpisodeWithTimerFirst(EpisodeWorkflow):
    """Waits a second before driving the harness: a timer the recorded runs never started."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(spec)


@workflow.defn(name="EpisodeWorkflow")
class EpisodeWithRetryBackoff(EpisodeWorkflow):
    """Backs off before re-admitting a lost call: changes only the crash-recovery branch."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        return await super().run(spec)

    async def _generate(self, call_id, req) -> GenerateResult:
        if ".r" in call_id:
            await workflow.sleep(timedelta(seconds=1))
        return await super()._generate(call_id, req)


@workflow.defn(name="TrainingRunWorkflow")
class TrainingRunWithOtherChildIds(TrainingRunWorkflow):
    """Starts the same episodes under another id scheme: a resumed run would not re-attach its children."""

    @workflow.run
    async def run(self, state: RunState) -> RunResult:
        return await super().run(state)

    async def _episodes(self, step: int) -> list[EpisodeResult]:
        assert self.state is not None
        handles = [
            await workflow.start_child_workflow(
                EpisodeWorkflow.run, spec, id=spec.episode_id.replace("/", "-"), task_queue=queues.EPISODES
            )
            for spec in step_specs(self.state, step)
        ]
        return [await h for h in handles]


@pytest.mark.parametrize("name", ["episode_scenario", "episode_lost_attempt"])
async def test_an_extra_timer_in_the_episode_fails_replay(name):
    with pytest.raises(workflow.NondeterminismError, match="(?i)timer"):
        await replay(name, EpisodeWithTimerFirst, TrainingRunWorkflow)


async def test_a_changed_recovery_branch_fails_only_the_history_that_took_it():
    await replay("episode_scenario", EpisodeWithRetryBackoff)  # nothing was lost: the branch never ran
    with pytest.raises(workflow.NondeterminismError, match="(?i)timer"):
        await replay("episode_lost_attempt", EpisodeWithRetryBackoff)


async def test_changed_child_episode_ids_fail_replay():
    with pytest.raises(workflow.NondeterminismError, match="Child workflow id"):
        await replay("training_run", EpisodeWorkflow, TrainingRunWithOtherChildIds)
