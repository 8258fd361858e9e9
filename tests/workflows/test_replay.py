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

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError
from temporalio.worker import Replayer

# The altered workflows below are defined here, so the sandbox imports this module: pass grove's modules
# through as the real workflow modules do (one class per model inside and outside the sandbox).
with workflow.unsafe.imports_passed_through():
    from grove import queues
    from grove.contracts import ArchiveStepsInput, EpisodeResult, GenerateResult, RunResult, RunState
    from ledger.handover import EpisodeRun
    from workflows.episode import EpisodeWorkflow
    from workflows.training_run import ARCHIVE_RETRY, TRACK_TIMEOUT, TrainingRunWorkflow, step_specs

HISTORIES = Path(__file__).parent / "histories"
# file -> (workflow type, workflow id) as record_histories.py records them
RECORDED = {
    "episode_scenario": ("EpisodeWorkflow", "replay/episode/t0/g0"),
    "episode_lost_attempt": ("EpisodeWorkflow", "replay/lost/t0/g0"),
    "training_run": ("TrainingRunWorkflow", "replay-run"),
    # recorded by the run workflow of before the bounded history (record_histories.py --pre-bound-run)
    "training_run_pre_bound": ("TrainingRunWorkflow", "replay-run-pre-bound"),
    # runs 2 and 3 of an external episode recorded by the episode workflow of before calls were settled
    # (record_histories.py --pre-settle-episode): a paged hand-over, then a paged close
    "episode_pre_settle_handover": ("EpisodeWorkflow", "replay/pre-settle/t0/g0"),
    "episode_pre_settle_close": ("EpisodeWorkflow", "replay/pre-settle/t0/g0"),
    # by today's code (record_histories.py --by-ref-episode): runs 2 and 3 of an external episode whose
    # completions all crossed by reference, a settled hand-over then a paged close; and a native program
    # that read its by-reference completion through load_completion
    "episode_by_ref_handover": ("EpisodeWorkflow", "replay/by-ref/t0/g0"),
    "episode_by_ref_close": ("EpisodeWorkflow", "replay/by-ref/t0/g0"),
    "episode_native_by_ref": ("EpisodeWorkflow", "replay/native-by-ref/t0/g0"),
}
CONTINUED = {"episode_pre_settle_handover", "episode_by_ref_handover"}  # runs that ended in a continue-as-new


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
    end = "CONTINUED_AS_NEW" if name in CONTINUED else "COMPLETED"
    assert types[-1] == f"EVENT_TYPE_WORKFLOW_EXECUTION_{end}"


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


def _payload(attrs: dict, field: str) -> dict:
    return json.loads(base64.b64decode(attrs[field]["payloads"][0]["data"]))


def test_the_pre_bound_run_carries_more_records_than_its_bound_and_archived_none():
    """What the bound's patch must keep replaying: a run of the workflow code from before the bound,
    whose state ends with more records than `carried_history_steps` and which archived none (a run
    started before the bound and past 100 steps, in 2 steps: the input asks to carry 1)."""
    events = json.loads((HISTORIES / "training_run_pre_bound.json").read_text())["events"]
    state = _payload(events[0]["workflowExecutionStartedEventAttributes"], "input")
    result = _payload(events[-1]["workflowExecutionCompletedEventAttributes"], "result")
    assert state["config"]["carried_history_steps"] == 1
    assert [r["step"] for r in result["history"]] == [1, 2]  # both carried: over the bound
    activities = scheduled_activities("training_run_pre_bound")
    assert activities.count("train_step") == 2 and "archive_step_records" not in activities


def test_the_pre_settle_runs_restore_and_write_the_whole_paged_ledger():
    """What the settle's patch must keep replaying: a run that restored its ledger from pages and handed
    it over as pages again (every call: nothing settled, no index), and the run that closed it."""
    handover = scheduled_activities("episode_pre_settle_handover")
    assert "load_ledger_page" in handover and "store_ledger_page" in handover
    assert "store_ledger_index" not in handover
    events = json.loads((HISTORIES / "episode_pre_settle_handover.json").read_text())["events"]
    carried = _payload(events[-1]["workflowExecutionContinuedAsNewEventAttributes"], "input")["carry"]
    assert carried["ledger_pages"] and carried.get("ledger") is None and not carried.get("settled")
    close = scheduled_activities("episode_pre_settle_close")
    assert "load_ledger_page" in close and "materialize_episode" in close


def _generate_results(name: str) -> list[dict]:
    """The decoded results of the run's completed `generate` activities."""
    events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    key = "activityTaskScheduledEventAttributes"
    generate = {e["eventId"] for e in events if key in e and e[key]["activityType"]["name"] == "generate"}
    done = "activityTaskCompletedEventAttributes"
    return [
        _payload(e[done], "result") for e in events if done in e and e[done]["scheduledEventId"] in generate
    ]


@pytest.mark.parametrize("name", ["episode_by_ref_handover", "episode_by_ref_close", "episode_native_by_ref"])
def test_the_by_ref_recordings_carry_references_not_completions(name):
    """What these recordings must keep covering: every generate result of the run is a reference (no
    token ids, no text), as the patched `grove-completion-by-ref` path returns a completion over
    COMPLETION_INLINE_MAX."""
    results = _generate_results(name)
    assert results and all(r["completion_ref"] and r.get("completion_ids") is None for r in results)
    assert all(r.get("text") is None and r.get("assistant_message") is None for r in results)


def test_the_by_ref_runs_settle_at_their_hand_over_and_the_native_one_loads_its_completion():
    handover = scheduled_activities("episode_by_ref_handover")
    assert handover.count("generate") == 4 and "store_ledger_index" in handover
    events = json.loads((HISTORIES / "episode_by_ref_handover.json").read_text())["events"]
    carried = _payload(events[-1]["workflowExecutionContinuedAsNewEventAttributes"], "input")["carry"]
    assert carried["settled"] and carried["ledger_index"] and not carried["ledger_pages"]
    # the carry holds the live calls only: fewer than the 7 the episode had made by then
    assert 0 < len(carried["ledger"]["calls"]) < 7
    close = scheduled_activities("episode_by_ref_close")
    assert "materialize_episode" in close and "store_ledger_page" in close
    assert scheduled_activities("episode_native_by_ref").count("load_completion") == 2
    # its second call named the first call's stored conversation instead of carrying it (ChatDelta)
    events = json.loads((HISTORIES / "episode_native_by_ref.json").read_text())["events"]
    key = "activityTaskScheduledEventAttributes"
    prompts = [
        _payload(e[key], "input")["prompt"]
        for e in events
        if key in e and e[key]["activityType"]["name"] == "generate"
    ]
    assert prompts[0]["chat"] and prompts[1]["chat_delta"]["parent_conversation"] and not prompts[1]["chat"]


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


@workflow.defn(name="TrainingRunWorkflow")
class TrainingRunWithUnpatchedBound(TrainingRunWorkflow):
    """The history bound as it first landed (e829cd1): the archive activity without `workflow.patched`."""

    @workflow.run
    async def run(self, state: RunState) -> RunResult:
        return await super().run(state)

    async def _bound_history(self) -> None:
        assert self.state is not None
        state = self.state
        old = len(state.history) - state.config.carried_history_steps
        if old <= 0:
            return
        inp = ArchiveStepsInput(run_id=state.config.run_id, records=state.history[:old])
        try:
            await workflow.execute_activity(
                "archive_step_records", inp, task_queue=queues.IO, start_to_close_timeout=TRACK_TIMEOUT,
                retry_policy=ARCHIVE_RETRY,
            )  # fmt: skip
        except ActivityError:
            return
        del state.history[:old]
        state.history_from += old


@workflow.defn(name="EpisodeWorkflow")
class EpisodeSettlingUnpatched(EpisodeWorkflow):
    """The settle without `workflow.patched`: every paged hand-over settles (an index, then the carry)."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        return await super().run(spec)

    def _settles(self) -> bool:
        return True


@workflow.defn(name="EpisodeWorkflow")
class EpisodeNotSettling(EpisodeWorkflow):
    """Hands a paged ledger over whole, as before the settle: no index, every call carried."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        return await super().run(spec)

    def _settles(self) -> bool:
        return False


@workflow.defn(name="EpisodeWorkflow")
class EpisodeWithoutCompletionLoad(EpisodeWorkflow):
    """Gives the native program the generate result as it came, without reading a by-reference
    completion through `load_completion`: changes only the claim check's native branch."""

    @workflow.run
    async def run(self, spec: EpisodeRun) -> EpisodeResult:
        return await super().run(spec)

    async def call(self, req):
        return await self._call(req)


async def test_dropping_the_settle_fails_the_settled_hand_over():
    with pytest.raises(workflow.NondeterminismError):
        await replay("episode_by_ref_handover", EpisodeNotSettling)


async def test_a_changed_completion_load_fails_only_the_native_run_that_read_by_reference():
    await replay("episode_scenario", EpisodeWithoutCompletionLoad)  # inline completions: branch never ran
    with pytest.raises(workflow.NondeterminismError):
        await replay("episode_native_by_ref", EpisodeWithoutCompletionLoad)


async def test_an_unpatched_settle_fails_the_hand_over_recorded_before_it():
    await replay("episode_pre_settle_close", EpisodeSettlingUnpatched)  # no hand-over in it: nothing
    with pytest.raises(workflow.NondeterminismError):
        await replay("episode_pre_settle_handover", EpisodeSettlingUnpatched)


async def test_an_unpatched_history_bound_fails_the_run_recorded_before_it():
    await replay("training_run", EpisodeWorkflow, TrainingRunWithUnpatchedBound)  # within its bound: nothing
    with pytest.raises(workflow.NondeterminismError):
        await replay("training_run_pre_bound", EpisodeWorkflow, TrainingRunWithUnpatchedBound)


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
