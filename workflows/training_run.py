"""TrainingRunWorkflow: the run as an entity workflow — episodes, learner step, weight publication.

A new run first has the trainer host stage its base model in the object store (`stage_base_model`,
trainer queue; trainer/base_model.py): version 0 is then the same bytes on every host, read from the
store, never from another host's folder. At start (and after each continue-as-new) the run publishes its
current version to its inference queue: the engine may have served another run, or restarted with the
base weights. Then per step N
(1-based; step N's optimizer update produces policy version N):
  tasks = task_indices(seed, N)            data order is a pure function of (seed, step)
  G EpisodeWorkflow children per task      deterministic ids {run}/s{N:06d}/t{task}/g{j}: a replayed
                                           or resumed run re-attaches instead of duplicating
  train_step activity (trainer queue)      gets one EpisodeRecord per episode of the step (rows or
                                           not) and pulls their rows; idempotent per step (a committed
                                           checkpoint of step N is returned, not recomputed)
  publish_weights activity (inference)     the engine loads version N; later calls report it
  every eval_every steps: held-out episodes of version N (workflows/evaluation.py), never trained on,
                                           recorded in the step's StepRecord.eval
All run state is one RunState, carried whole through continue-as-new every few steps. It stays bounded:
it holds the last `carried_history_steps` StepRecords; older ones are written to the object store
(`archive_step_records`, runs/{run_id}/steps/step-N.json) and `history_from` says where the carried ones
start (cli/runs.py `step_history` joins both).

Cancel (`grove run cancel`, the `cancel` signal) stops the run cleanly at the next step boundary: the
step in progress finishes (its episodes settle, its checkpoint commits, its weights are published), no
new step starts, and the run completes with `RunResult.cancelled` and GroveStatus "cancelled". Starting
the same run id again resumes at the next step (cli/runs.py). Temporal's own cancellation or
termination is the hard stop: nothing is half-written either way (checkpoints have COMMIT markers),
but such a run is closed for good (`grove run start` refuses to resume it under the same id).

A child that fails, is terminated, cancelled or times out never fails the run: its result becomes an
infrastructure-failed EpisodeResult (no rows), which the learner excludes from its group's baseline and
the StepRecord counts (`failures_by_kind`, `excluded_episodes`). A child that failed by the policy's
own behaviour returns normally with status "failed" and kind "policy" (workflows/episode.py).
Every child runs under `RunConfig.episode_timeout_s`, enforced by the server: an episode whose own
code cannot run any more (a workflow task that fails on every attempt) times out instead of holding
its step, or the evaluation its step waits for, forever.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from grove import queues
    from grove.contracts import (
        ArchiveStepsInput,
        EngineStatus,
        EpisodeResult,
        EpisodeSpec,
        EvalRecord,
        PolicyRef,
        PublishInput,
        PublishResult,
        RunConfig,
        RunLive,
        RunResult,
        RunState,
        StepRecord,
        TrackStepInput,
        TrackStepResult,
        TrainStepInput,
        TrainStepResult,
    )
    from grove.contracts.training import StageBaseModelInput, StageBaseModelResult
    from grove.data_order import task_indices
    from grove.episode_start import EPISODE_WORKFLOW
    from grove.store_layout import rows_key
    from grove.visibility import GROVE_RUN
    from harnesses.programs import family
    from workflows.evaluation import eval_record, eval_specs, evaluates_at
    from workflows.step_metrics import rollout_metrics

RUN = GROVE_RUN
STEP = SearchAttributeKey.for_int("GroveStep")
STATUS = SearchAttributeKey.for_keyword("GroveStatus")
TASK = SearchAttributeKey.for_keyword("GroveTask")

TRAIN_TIMEOUT = timedelta(hours=2)
TRAIN_HEARTBEAT = timedelta(seconds=60)
PUBLISH_TIMEOUT = timedelta(minutes=10)
TRACK_TIMEOUT = timedelta(minutes=2)
STATUS_TIMEOUT = timedelta(seconds=30)
TRACK_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2))
# train_step / publish_weights: a storage or trainer outage is waited out for ~19 min (2, 4, ... 30 s,
# then every 30 s: a store back after an outage is found within 30 s), never turned into a failed run.
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30), maximum_attempts=40
)
# archive_step_records: a few minutes of retries; a store down for longer only delays the archive
ARCHIVE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30), maximum_attempts=10
)


def episode_id(run_id: str, step: int, task: int, j: int) -> str:
    return f"{run_id}/s{step:06d}/t{task}/g{j}"


def group_id(run_id: str, step: int, task: int) -> str:
    return f"{run_id}/s{step:06d}/t{task}"


def step_specs(state: RunState, step: int) -> list[EpisodeSpec]:
    """The episodes of `step`: G per task, tasks from the pure data order."""
    cfg = state.config
    make_task, _ = family(cfg.task_family)
    specs = []
    for t in task_indices(cfg.seed, step, cfg.tasks_per_step, cfg.num_tasks):
        for j in range(cfg.group_size):
            specs.append(
                EpisodeSpec(
                    run_id=cfg.run_id,
                    step=step,
                    group_id=group_id(cfg.run_id, step, t),
                    episode_id=episode_id(cfg.run_id, step, t, j),
                    index_in_group=j,
                    task=make_task(t),
                    harness=cfg.harness,
                    sampling=cfg.sampling,
                    train_agents=cfg.train_agents,
                    train_auxiliary=cfg.train_auxiliary,
                    inference_queue=cfg.inference_queue,
                    policy=PolicyRef(
                        run_id=cfg.run_id, min_version=min_version(cfg, step), base_model=cfg.model
                    ),
                )  # fmt: skip
            )
    return specs


def min_version(cfg: RunConfig, step: int) -> int:
    """The oldest policy version step `step` may sample with: its update starts from version step - 1,
    and no trained token may be sampled more than max_policy_lag versions before that."""
    return max(0, step - 1 - cfg.max_policy_lag)


@workflow.defn
class TrainingRunWorkflow:
    def __init__(self) -> None:
        self.state: RunState | None = None
        self.current_step = 0
        self.cancel_requested = False
        # overlapped runs (max_policy_lag > 0): what the progress query shows
        self.committed = 0  # newest committed policy version of the run
        self.next_launch = 0  # the next step whose episodes are not started
        self.training_step: int | None = None  # the step the learner trains now
        self.draining = False

    @workflow.run
    async def run(self, state: RunState) -> RunResult:
        self.state = state
        cfg = state.config
        _check_config(state)
        workflow.upsert_search_attributes([RUN.value_set(cfg.run_id), STATUS.value_set("running")])
        if state.next_step == 1:
            await self._stage_base_model()
        # The engine may serve another run's policy, or restarted with the base weights: load ours.
        await self._publish(state.next_step - 1)
        self._show(committed_version=state.next_step - 1)
        if cfg.max_policy_lag == 0:
            await self._run_synchronous(state)
        else:
            await self._run_overlapped(state)
        cancelled = state.next_step <= cfg.steps  # stopped early: only a cancel request does that
        workflow.upsert_search_attributes([STATUS.value_set("cancelled" if cancelled else "completed")])
        return RunResult(
            run_id=cfg.run_id, steps=state.steps_recorded, history=state.history, cancelled=cancelled,
            history_from=state.history_from,
        )  # fmt: skip

    async def _run_synchronous(self, state: RunState) -> None:
        """max_policy_lag 0: each step rolls out on the previous step's weights, then trains."""
        cfg = state.config
        while state.next_step <= cfg.steps and not self.cancel_requested:
            step = self.current_step = state.next_step
            workflow.upsert_search_attributes([STEP.value_set(step)])
            t0 = workflow.now()
            self._show(rolling_out=[step])
            results = await self._episodes(step)
            t1 = workflow.now()
            self._show(training_step=step, rolling_out=[])
            await self._refresh_engines(step)
            train = await self._train(step, results)
            self._show(training_step=None, committed_version=train.policy_version)
            await self._finish_step(state, results, train, rolled_out=(t0, t1), step_start=t0)
            more = state.next_step <= cfg.steps and not self.cancel_requested
            if more and self._should_continue_as_new(step):
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self.cancel_requested:  # a cancel that came while waiting must not be lost
                    workflow.continue_as_new(state)

    async def _run_overlapped(self, state: RunState) -> None:
        """max_policy_lag k > 0: step S's episodes start as soon as version S-1-k is committed, so later
        steps roll out while the learner trains. Steps still train one by one, in order, each on all
        of its groups. Launches stop at the workflow run's continue-as-new boundary (every
        `continue_as_new_every` steps): the pipeline drains there, so no child outlives its parent run."""
        cfg = state.config
        k = cfg.max_policy_lag
        every = cfg.continue_as_new_every
        boundary = min(cfg.steps, ((state.next_step - 1) // every + 1) * every)
        pending: dict[int, asyncio.Task[list[EpisodeResult]]] = {}
        started: dict[int, datetime] = {}
        self.next_launch = state.next_step

        def launch() -> None:
            limit = min(boundary, self.committed + 1 + k)
            while self.next_launch <= limit and not self.cancel_requested and not self.draining:
                started[self.next_launch] = workflow.now()
                pending[self.next_launch] = asyncio.create_task(self._episodes(self.next_launch))
                self.next_launch += 1
            self._show(rolling_out=sorted(pending), committed_version=self.committed)

        self.committed = state.next_step - 1
        last_end: datetime | None = None
        launch()
        while state.next_step in pending:
            step = self.current_step = state.next_step
            workflow.upsert_search_attributes([STEP.value_set(step)])
            results = await pending.pop(step)
            t1 = workflow.now()
            self.training_step = step
            self._show(training_step=step, rolling_out=sorted(pending))
            await self._refresh_engines(step)
            train = await self._train(step, results)
            self.training_step = None
            self.committed = train.policy_version
            self._show(training_step=None, committed_version=self.committed)
            launch()  # later steps start now; their engines load the new version by themselves
            # step_s: since the previous step was recorded (steps overlap: their rollouts are not serial)
            last_end = await self._finish_step(
                state, results, train, rolled_out=(started.pop(step), t1), step_start=last_end or t1
            )
            if workflow.info().is_continue_as_new_suggested():
                self.draining = True  # launch nothing more; continue as new once the pipeline is empty
            more = state.next_step <= cfg.steps and not self.cancel_requested
            if more and not pending and (step == boundary or self.draining):
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self.cancel_requested:
                    workflow.continue_as_new(state)

    async def _finish_step(
        self,
        state: RunState,
        results: list[EpisodeResult],
        train: TrainStepResult,
        *,
        rolled_out: tuple[datetime, datetime],
        step_start: datetime,
    ) -> datetime:
        """After step `state.next_step` trained (both loops): publish its version, record, evaluate and track
        it, carry the record and move to the next step. `rolled_out` is (rollout start, training start);
        returns when the step was recorded (before its evaluation). The workflow commands and their order
        are those both loops issued before they shared this body: recorded histories replay unchanged."""
        step = state.next_step
        train_start = rolled_out[1]
        t2 = workflow.now()
        await self._publish(train.policy_version)
        record = _record(step, results, train)
        record.rollout = rollout_metrics(results)
        t3 = workflow.now()
        record.eval = await self._evaluate(step, train.policy_version)
        record.timings = _seconds(
            rollout_s=train_start - rolled_out[0], train_s=t2 - train_start, step_s=t3 - step_start,
            eval_s=workflow.now() - t3,
        )  # fmt: skip
        await self._track(record)
        state.history.append(record)
        state.next_step += 1
        await self._bound_history()
        return t3

    async def _episodes(self, step: int) -> list[EpisodeResult]:
        assert self.state is not None
        handles = []
        specs = step_specs(self.state, step)
        for spec in specs:
            handles.append(
                await workflow.start_child_workflow(
                    EPISODE_WORKFLOW,  # by name: its input, this EpisodeSpec, decodes there as an EpisodeRun
                    spec,
                    result_type=EpisodeResult,
                    id=spec.episode_id,
                    task_queue=queues.EPISODES,
                    execution_timeout=_episode_bound(self.state.config),
                    memo={"task_id": spec.task.task_id, "group_id": spec.group_id},
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(RUN, spec.run_id),
                            SearchAttributePair(STEP, step),
                            SearchAttributePair(TASK, spec.task.task_id),
                        ]
                    ),
                )  # fmt: skip
            )
        # return_exceptions: one child's failure must not cancel or fail the others (nor the run);
        # results stay in spec order, so the outcome is deterministic.
        outcomes = await asyncio.gather(*handles, return_exceptions=True)
        return [_result_of(spec, out) for spec, out in zip(specs, outcomes, strict=True)]

    async def _evaluate(self, step: int, version: int) -> EvalRecord | None:
        """Held-out episodes of the just-published policy (workflows/evaluation.py); never trained on."""
        assert self.state is not None
        if not evaluates_at(self.state.config, step):
            return None
        handles = []
        for spec in eval_specs(self.state.config, step):
            handles.append(
                await workflow.start_child_workflow(
                    EPISODE_WORKFLOW,  # by name: its input, this EpisodeSpec, decodes there as an EpisodeRun
                    spec,
                    result_type=EpisodeResult,
                    id=spec.episode_id,
                    task_queue=queues.EPISODES,
                    execution_timeout=_episode_bound(self.state.config),
                    memo={"task_id": spec.task.task_id, "group_id": spec.group_id, "eval": True},
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(RUN, spec.run_id),
                            SearchAttributePair(STEP, step),
                            SearchAttributePair(TASK, spec.task.task_id),
                        ]
                    ),
                )
            )
        outcomes = await asyncio.gather(*handles, return_exceptions=True)
        for out in outcomes:  # a failed eval episode is counted as failed; anything else is the run's
            if isinstance(out, BaseException) and not isinstance(out, ChildWorkflowError):
                raise out
        return eval_record(version, [o if isinstance(o, EpisodeResult) else None for o in outcomes])

    async def _bound_history(self) -> None:
        """Keep the last `carried_history_steps` StepRecords in the state (one payload, carried through
        continue-as-new: a record per step would pass Temporal's 2 MB payload limit on a long run; measured:
        docs/results.md section 3.7); older records go to the store first (deterministic keys,
        verify-if-present). A store that stays down past the retries only delays this: the records stay
        carried and the next step tries again.
        Patched in: a run recorded before the bound carries more records than it and never archived
        them; it replays without the archive (and keeps them until its next continue-as-new)."""
        assert self.state is not None
        state = self.state
        old = len(state.history) - state.config.carried_history_steps
        if old <= 0:
            return  # no command (and no patch marker) while the history is within the bound
        if not workflow.patched("grove-bound-run-history"):
            return
        inp = ArchiveStepsInput(run_id=state.config.run_id, records=state.history[:old])
        try:
            await workflow.execute_activity(
                "archive_step_records", inp, task_queue=queues.IO, start_to_close_timeout=TRACK_TIMEOUT,
                retry_policy=ARCHIVE_RETRY,
            )  # fmt: skip
        except ActivityError as err:
            workflow.logger.warning(
                "run %s: step records not archived yet: %s", state.config.run_id, err.cause
            )
            return
        del state.history[:old]
        state.history_from += old

    async def _track(self, record: StepRecord) -> None:
        """The step's scalars to TensorBoard / MLflow (activities/tracking.py). Best effort: a tracking
        failure is logged and never stops training. Patched in: runs recorded before it replay unchanged."""
        assert self.state is not None
        cfg = self.state.config
        if not workflow.patched("grove-track-step") or not (
            cfg.tracking.tensorboard or cfg.tracking.mlflow_uri
        ):
            return
        try:
            await workflow.execute_activity(
                "track_step", TrackStepInput(run_id=cfg.run_id, record=record, tracking=cfg.tracking),
                task_queue=queues.IO, start_to_close_timeout=TRACK_TIMEOUT, retry_policy=TRACK_RETRY,
                result_type=TrackStepResult,
            )  # fmt: skip
        except ActivityError as err:
            workflow.logger.warning(
                "run %s step %d: metrics not tracked: %s", cfg.run_id, record.step, err.cause
            )

    async def _train(self, step: int, results: list[EpisodeResult]) -> TrainStepResult:
        assert self.state is not None
        cfg = self.state.config
        inp = TrainStepInput(
            run_id=cfg.run_id, step=step, model=cfg.model,
            row_keys=sorted(r.rows_key for r in results if r.failure_kind != "infrastructure"),
            learner=cfg.learner, episodes=[r.record() for r in results],
            max_policy_lag=cfg.max_policy_lag, off_policy_is_cap=cfg.off_policy_is_cap,
        )  # fmt: skip
        return await workflow.execute_activity(
            "train_step", inp, task_queue=queues.TRAINER, start_to_close_timeout=TRAIN_TIMEOUT,
            heartbeat_timeout=TRAIN_HEARTBEAT, retry_policy=RETRY, result_type=TrainStepResult,
        )  # fmt: skip

    async def _stage_base_model(self) -> None:
        """Version 0 into the store before any engine serves it or the learner starts from it. Patched
        in: runs recorded before it replay unchanged (their hosts resolve the model themselves)."""
        assert self.state is not None
        if not workflow.patched("grove-base-model-in-store"):
            return
        cfg = self.state.config
        await workflow.execute_activity(
            "stage_base_model", StageBaseModelInput(run_id=cfg.run_id, model=cfg.model),
            task_queue=queues.TRAINER, start_to_close_timeout=TRAIN_TIMEOUT,
            heartbeat_timeout=TRAIN_HEARTBEAT, retry_policy=RETRY, result_type=StageBaseModelResult,
        )  # fmt: skip

    async def _publish(self, version: int) -> PublishResult:
        assert self.state is not None
        cfg = self.state.config
        return await workflow.execute_activity(
            "publish_weights", PublishInput(run_id=cfg.run_id, version=version, base_model=cfg.model),
            task_queue=cfg.inference_queue, start_to_close_timeout=PUBLISH_TIMEOUT, retry_policy=RETRY,
            result_type=PublishResult,
        )  # fmt: skip

    def _show(self, **fields: Any) -> None:
        """Update what the `progress` query shows of the run's moving parts (RunLive)."""
        assert self.state is not None
        cfg = self.state.config
        live = self.state.live or RunLive(max_policy_lag=cfg.max_policy_lag)
        live = live.model_copy(update=fields)
        newest = max(live.rolling_out, default=None)
        live.lag = max(0, newest - 1 - live.committed_version) if newest is not None else 0
        self.state.live = live

    async def _refresh_engines(self, step: int) -> None:
        """The engines of the run's inference queue as they report themselves (activities/engine_status.py),
        for the progress query. Best effort: a failure leaves the previous list. Patched in: runs
        recorded before it replay unchanged."""
        assert self.state is not None
        if not workflow.patched("grove-engine-status"):
            return
        try:
            engines = await workflow.execute_activity(
                "engine_statuses", self.state.config.inference_queue, task_queue=queues.IO,
                start_to_close_timeout=STATUS_TIMEOUT, retry_policy=RetryPolicy(maximum_attempts=1),
                result_type=list[EngineStatus],
            )  # fmt: skip
        except ActivityError as err:
            workflow.logger.warning("engine statuses not read: %s", err.cause)
            return
        self._show(engines=engines, engines_as_of_step=step)

    def _should_continue_as_new(self, step: int) -> bool:
        assert self.state is not None
        every = self.state.config.continue_as_new_every
        return step % every == 0 or workflow.info().is_continue_as_new_suggested()

    @workflow.signal(name="cancel")
    def cancel(self) -> None:
        """Stop after the step in progress (see the module docstring)."""
        if not self.cancel_requested:
            self.cancel_requested = True
            workflow.upsert_search_attributes([STATUS.value_set("cancelling")])

    @workflow.query(name="progress")
    def progress(self) -> RunState | None:
        return self.state


def _check_config(state: RunState) -> None:
    """Fail the run (not just the workflow task, which would retry forever) on a config that cannot work."""
    try:
        step_specs(state, state.next_step)
        if state.config.eval_every:
            eval_specs(state.config, state.config.eval_every)
    except (ValueError, KeyError) as err:
        raise ApplicationError(
            f"run {state.config.run_id}: invalid configuration: {err}",
            type=type(err).__name__,
            non_retryable=True,
        ) from err


def _episode_bound(cfg: RunConfig) -> timedelta | None:
    """The server-side bound on a child (RunConfig.episode_timeout_s): a child whose own code cannot
    run (its workflow tasks fail on every attempt) still ends, as timed out, and the step goes on."""
    return None if cfg.episode_timeout_s is None else timedelta(seconds=cfg.episode_timeout_s)


def _result_of(spec: EpisodeSpec, outcome: EpisodeResult | BaseException) -> EpisodeResult:
    """A child's result; a child that raised (failed, terminated, cancelled, timed out) becomes an
    infrastructure-failed result without rows, so the step goes on without it."""
    if isinstance(outcome, EpisodeResult):
        return outcome
    if not isinstance(outcome, ChildWorkflowError):
        raise outcome  # not a child's failure (e.g. the run itself is being cancelled)
    cause = outcome.cause
    why = f"{type(cause).__name__}: {cause}" if cause is not None else str(outcome)
    return EpisodeResult(
        episode_id=spec.episode_id, group_id=spec.group_id, task_id=spec.task.task_id, status="failed",
        reward=0.0, rows_key=rows_key(spec.episode_id), num_rows=0, eligible_tokens=0, counts={},
        failure=f"child workflow ended without a result: {why}", failure_kind="infrastructure",
    )  # fmt: skip


def _record(step: int, results: list[EpisodeResult], train: TrainStepResult) -> StepRecord:
    ok = [r for r in results if r.status == "ok"]
    kinds = [r.record().failure_kind for r in results if r.status == "failed"]
    by_kind = {k: kinds.count(k) for k in sorted({k for k in kinds if k is not None})}
    return StepRecord(
        step=step,
        mean_reward=sum(r.reward for r in ok) / len(ok) if ok else 0.0,
        episodes=len(results),
        failed_episodes=len(results) - len(ok),
        policy_version=train.policy_version,
        metrics=train.metrics,
        reward_components=reward_components(ok),
        failures_by_kind=by_kind,
        excluded_episodes=by_kind.get("infrastructure", 0),
    )


def _seconds(**spans: timedelta) -> dict[str, float]:
    return {k: v.total_seconds() for k, v in spans.items()}


def reward_components(results: list[EpisodeResult]) -> dict[str, float]:
    """Mean of each reward component over the episodes that report it (e.g. delegation's per agent)."""
    names = sorted({k for r in results for k in r.reward_details})
    return {
        k: sum(v) / len(v)
        for k in names
        if (v := [r.reward_details[k] for r in results if k in r.reward_details])
    }
