"""A training run's carried state stays bounded however many steps it takes.

The run workflow's RunState is one payload carried through continue-as-new; it grew with every
StepRecord, so a long run would pass Temporal's 2 MB payload limit (docs/results.md section 3.7). Now
it carries the last `carried_history_steps` records and the store holds the rest
(runs/{run_id}/steps/step-N.json). With a threshold of one record and a continue-as-new after every
step, a run crosses both boundaries (continue-as-new, then a completed run resumed with more steps) and
goes on exactly: every step trained once, every episode run once, every record kept (the carried ones
and the archived ones), and what `grove run status` shows (steps done, the last record) is what it
showed with the whole history.

Real services: the session's Temporal dev server and in-process worker (vLLM on the tiny model, the
learner on CPU), the session's local store.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from cli.runs import run_status, start_run, step_history, wait_run
from grove.contracts import HarnessSpec, RunConfig, RunState, TrackingConfig, TrainStepInput
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from grove.store_layout import commit_key, step_record_key
from harnesses import scenario
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

GROUP = 2


def _config(run_id: str, model_dir: Path, steps: int) -> RunConfig:
    return RunConfig(
        run_id=run_id, model=str(model_dir), seed=3, steps=steps, task_family=scenario.NAME, num_tasks=8,
        tasks_per_step=1, group_size=GROUP, harness=HarnessSpec(program=scenario.NAME),
        sampling=SamplingConfig(max_tokens=8), learner=LearnerConfig(lr=1e-3),
        tracking=TrackingConfig(tensorboard=False), continue_as_new_every=1, carried_history_steps=1,
    )  # fmt: skip


async def _chain(client: Client, workflow_id: str, first_run_id: str) -> list:
    """The histories of an execution's runs, following its continue-as-new links from its first run."""
    histories, run_id = [], first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return histories


async def _scheduled(client: Client, history, activity: str, input_type):
    out = []
    for event in history.events:
        attrs = event.activity_task_scheduled_event_attributes
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and attrs.activity_type.name == activity
        ):
            [value] = await client.data_converter.decode(attrs.input.payloads, [input_type])
            out.append(value)
    return out


async def test_a_run_past_its_carried_history_continues_and_resumes_exactly(
    temporal_client: Client, grove_worker, e2e_store: LocalStore, tiny_model_dir: Path
):
    run_id = f"bound-{uuid.uuid4().hex[:6]}"
    first = await start_run(temporal_client, _config(run_id, tiny_model_dir, 2))
    assert first.action == "started"
    done = await wait_run(first.handle)
    assert (done.steps, done.history_from, [r.step for r in done.history]) == (2, 2, [2])

    # a completed run with more steps resumes at step 3 from its bounded result
    again = await start_run(temporal_client, _config(run_id, tiny_model_dir, 3))
    assert (again.action, again.next_step) == ("resumed", 3)
    final = await wait_run(again.handle)
    assert (final.steps, final.history_from, [r.step for r in final.history]) == (3, 3, [3])

    # every record is kept: the archived ones in the store, the last one in the result
    records = step_history(e2e_store, run_id, final.history, final.history_from)
    assert [r.step for r in records] == [1, 2, 3]
    assert [r.policy_version for r in records] == [1, 2, 3]
    assert all(r.episodes == GROUP for r in records), records
    assert done.history[0] == records[1]  # the archive holds the record the run carried, unchanged

    runs = await _chain(temporal_client, run_id, first.handle.first_execution_run_id)
    runs += await _chain(temporal_client, run_id, again.handle.first_execution_run_id)
    assert len(runs) == 3  # step 1 | continue-as-new: step 2 | resumed: step 3
    carried = []
    for history in runs:
        attrs = history.events[0].workflow_execution_started_event_attributes
        [state] = await temporal_client.data_converter.decode(attrs.input.payloads, [RunState])
        carried.append((state.next_step, state.history_from, [r.step for r in state.history]))
    # what each run started with: never more than one record, and the archived ones are not carried
    assert carried == [(1, 1, []), (2, 1, [1]), (3, 2, [2])]
    # each step trained exactly once, on its own episodes (none lost, none run twice)
    trained = [
        inp for h in runs for inp in await _scheduled(temporal_client, h, "train_step", TrainStepInput)
    ]
    assert [t.step for t in trained] == [1, 2, 3]
    for t in trained:
        ids = [e.episode_id for e in t.episodes]
        assert len(ids) == len(set(ids)) == GROUP and all(f"/s{t.step:06d}/" in i for i in ids), ids
    assert all(e2e_store.stat(commit_key(run_id, step)) is not None for step in (1, 2, 3))
    assert [e2e_store.stat(step_record_key(run_id, s)) is not None for s in (1, 2, 3)] == [True, True, False]

    # `grove run status` shows what it showed when the state carried every record
    status = await run_status(temporal_client, run_id)
    assert (status["steps_done"], status["steps"]) == (3, 3)
    assert status["last"] == records[-1].model_dump(mode="json")
