"""The `train_step` activity (trainer queue): one GRPO optimizer step per run step, idempotent.

The trainer worker keeps its Learner in memory between steps. A step whose checkpoint is already
committed is returned as it is (a retried or replayed activity never trains twice); a worker that
starts cold, or crashed mid-step, resumes from the committed checkpoint of the previous step (or the
base model for step 1), so the weights after step N are those of an uninterrupted run.
Metrics are written beside the checkpoint before its COMMIT marker.

The run's base model reaches the learner through the store: `stage_base_model` (run at the run's
start) resolves `RunConfig.model` on this host and commits its files (trainer/base_model.py); step 1
and the KL reference then start from those bytes, downloaded and verified, on whichever trainer host
runs them. A run that staged no base (started before staging existed) resolves the model here.

The step's input lists every episode of the step as an EpisodeRecord (grove/episodes.py), whatever
rows it produced: the rows of each record with a `rows_key` are loaded, and the records go to the
learner, whose group baselines and rollout count are over them (an episode with zero rows still
counts; a terminated child has no rows file and is an excluded infrastructure failure).

`LearnerConfig.ranks > 1`: the step runs on that many FSDP2 rank processes started and supervised
by this activity (activities/train_ranks.py); nothing stays in memory between steps (every attempt
starts from the committed checkpoint), a dead rank fails the attempt with the retryable
RankLostError before anything is written, and the checkpoint's optimizer state is sharded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import torch
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.failures import retryable_storage_failure
from activities.train_ranks import (
    ADVANTAGES_FILE,
    CHECKPOINT_DIR,
    GUARD_FILE,
    METRICS_FILE,
    OUT_DIR,
    RankJob,
    run_ranks,
)
from grove.contracts import TrainStepInput, TrainStepResult
from grove.contracts.training import StageBaseModelInput, StageBaseModelResult
from grove.episodes import EpisodeRecord
from grove.store_layout import MODEL_DIR, commit_key, episodes_key, guard_refusal_key, metrics_key
from models.registry import ModelResolutionError, NotAModelFolderError, ensure_model
from storage.base import ObjectStore, StorageError
from trainer.base_model import BaseModelFolderError, base_manifest, download_base_model, stage_base_model
from trainer.checkpoint import (
    check_config,
    commit_files,
    download_checkpoint,
    load_checkpoint,
    local_checkpoint_files,
    save_checkpoint,
)
from trainer.learner import GradientRefusal, Learner
from trainer.off_policy import PolicyLagError, check_policy_lag, lag_metrics
from trainer.rows import Row, rows_from_parquet

HEARTBEAT_EVERY_S = 10.0


class RunAlreadyTrainedError(RuntimeError):
    """A run started at step 1 whose id already has a committed step 1 in the store."""


class TrainerActivities:
    def __init__(
        self,
        store: ObjectStore,
        work_dir: Path,
        device: str | None = None,
        *,
        rank_threads: int | None = None,
    ) -> None:
        self.store = store
        self.work_dir = Path(work_dir)
        self.device = device
        # torch threads of each rank process (ranks > 1); default: this process's threads / ranks
        self.rank_threads = rank_threads
        self.learner: Learner | None = None
        self.run_id: str | None = None

    def _learner_before(self, inp: TrainStepInput) -> Learner:
        """The learner holding the weights of version inp.step - 1."""
        have = self.learner
        same_run = have is not None and self.run_id == inp.run_id and have.config == inp.learner
        if same_run and have is not None and have.step_count == inp.step - 1:
            return have
        # A KL penalty anchors every step to the run's start model, the frozen reference (fetched only
        # then: a resumed run without one needs nothing but its checkpoint)
        reference = self._base_model(inp.run_id, inp.model) if inp.learner.kl_coef > 0 else None
        if inp.step == 1:
            start = reference or self._base_model(inp.run_id, inp.model)  # the reference is the start model
            learner = Learner(start, inp.learner, device=self.device, reference_dir=reference)
        else:
            dest = Path(tempfile.mkdtemp(prefix=f"step-{inp.step - 1:06d}-", dir=self.work_dir))
            learner = load_checkpoint(
                self.store, inp.run_id, inp.step - 1, inp.learner, dest, device=self.device,
                reference_dir=reference,
            )  # fmt: skip
        self.learner, self.run_id = learner, inp.run_id
        return learner

    def _base_model(self, run_id: str, model: str, dest: Path | None = None) -> Path:
        """The run's base model on this host's disk: the staged bytes from the store, downloaded into
        `dest` (default a new folder under work_dir) and verified; or the model resolved here when the
        run staged none (runs started before staging)."""
        manifest = base_manifest(self.store, run_id)
        if manifest is None:
            return ensure_model(model)
        if dest is None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            dest = Path(tempfile.mkdtemp(prefix="base-model-", dir=self.work_dir))
        return download_base_model(self.store, run_id, manifest, dest)

    def _stage(self, inp: StageBaseModelInput) -> StageBaseModelResult:
        # A run stages its base model only when it starts at step 1. Its id having a committed step 1
        # means this is a second start of a run already trained (a workflow started anew under the same
        # id): training it again from version 0, under the same episode ids, would train steps twice.
        if self.store.exists(commit_key(inp.run_id, 1)):
            raise RunAlreadyTrainedError(
                f"run {inp.run_id!r} already committed step 1 in the store: a run starts at step 1 once. "
                "Resume it where it stopped with `grove run start` (or RunState(next_step=..., history=...) "
                "from its last result), or start it under a new run_id"
            )
        if (manifest := base_manifest(self.store, inp.run_id)) is not None:
            return StageBaseModelResult(files=len(manifest), written=False)
        manifest, written = stage_base_model(self.store, inp.run_id, ensure_model(inp.model), inp.model)
        return StageBaseModelResult(files=len(manifest), written=written)

    @activity.defn(name="stage_base_model")
    async def stage_base_model(self, inp: StageBaseModelInput) -> StageBaseModelResult:
        """Commit the run's base model to the store (idempotent); heartbeats while a named model builds."""
        task = asyncio.create_task(asyncio.to_thread(self._stage, inp))
        try:
            while not task.done():
                activity.heartbeat({"run": inp.run_id, "model": inp.model})
                await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
            return task.result()
        except (ModelResolutionError, NotAModelFolderError, BaseModelFolderError) as exc:
            raise ApplicationError(
                f"stage_base_model {inp.run_id}: the trainer host cannot resolve the run's model "
                f"{inp.model!r}: {exc}", type=type(exc).__name__, non_retryable=True,
            ) from exc  # fmt: skip
        except RunAlreadyTrainedError as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc
        except StorageError as err:  # an outage: retried by the run's policy
            raise retryable_storage_failure(f"stage_base_model {inp.run_id}", err) from None

    def _rows(self, keys: list[str]) -> list[Row]:
        return [row for key in keys for row in rows_from_parquet(self.store.get(key))]

    def _batch(self, inp: TrainStepInput) -> tuple[list[Row], list[EpisodeRecord] | None]:
        """The step's rows and episode records (rows-only when the input names no records)."""
        keys, records = self._batch_refs(inp)
        return self._rows(keys), records

    @staticmethod
    def _batch_refs(inp: TrainStepInput) -> tuple[list[str], list[EpisodeRecord] | None]:
        """The rows files to read and the episode records (None: rows-only)."""
        if not inp.episodes:
            return list(inp.row_keys), None
        # Only an episode the learner trains or scores needs its rows: an excluded one's (if any) stay
        # unread, so a file that never got written (terminated child) is not an error.
        keys = sorted(e.rows_key for e in inp.episodes if e.rows_key is not None and e.in_baseline)
        records = [e if e.in_baseline else e.model_copy(update={"num_rows": None}) for e in inp.episodes]
        return keys, records

    def _train(self, inp: TrainStepInput) -> dict[str, float]:
        learner = self._learner_before(inp)
        rows, records = self._batch(inp)
        if inp.max_policy_lag is not None:  # the run's staleness bound (trainer/off_policy.py)
            check_policy_lag(rows, inp.step - 1, inp.max_policy_lag)
        learner.is_cap = inp.off_policy_is_cap
        metrics = learner.step(rows, records)
        if learner.last_refusal is not None:  # skipped or accepted (LearnerConfig.guard_refusal)
            self._record_refusal(inp, learner.last_refusal, inp.learner.guard_refusal)
        values = {k: float(v) for k, v in metrics.model_dump().items() if isinstance(v, int | float)}
        values.update(lag_metrics(rows, inp.step - 1))
        self.store.put(metrics_key(inp.run_id, inp.step), json.dumps(values, sort_keys=True).encode())
        episodes = {e: dataclasses.asdict(a) for e, a in learner.last_advantages.items()}
        self.store.put(episodes_key(inp.run_id, inp.step), json.dumps(episodes, sort_keys=True).encode())
        save_checkpoint(self.store, inp.run_id, learner)
        return values

    def _record_refusal(self, inp: TrainStepInput, evidence: dict, outcome: str) -> None:
        record = {"guard_refused": 1, "outcome": outcome, **evidence}
        self.store.put(guard_refusal_key(inp.run_id, inp.step), json.dumps(record, sort_keys=True).encode())

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        try:
            committed = self.store.exists(commit_key(inp.run_id, inp.step))
        except StorageError as err:
            raise retryable_storage_failure(f"train_step {inp.step}", err) from None
        if committed:
            return TrainStepResult(
                step=inp.step,
                policy_version=inp.step,
                reused_checkpoint=True,
                metrics=self._saved_metrics(inp),
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if inp.learner.ranks > 1:
            self.learner = None  # the ranks' weights live in the checkpoints, not in this process
            task = asyncio.create_task(self._train_ranks(inp))
        else:
            task = asyncio.create_task(asyncio.to_thread(self._train, inp))
        try:
            while not task.done():  # heartbeat while the step runs (a dead worker times out)
                activity.heartbeat({"run": inp.run_id, "step": inp.step, "rows": len(inp.row_keys)})
                await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
        except asyncio.CancelledError:
            # the activity was cancelled: stop the step too (on ranks, run_ranks kills and reaps them;
            # a thread cannot be interrupted and finishes on its own, committing nothing new twice)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        try:
            metrics = task.result()
        except PolicyLagError as exc:  # the same rows would fail again: fail the step, name the call
            raise ApplicationError(
                f"train_step {inp.run_id} step {inp.step}: {exc}", type="PolicyLagError", non_retryable=True
            ) from exc
        except GradientRefusal as exc:  # deterministic: the same rows and weights refuse again
            await asyncio.to_thread(self._record_refusal, inp, exc.evidence, "fail")
            raise ApplicationError(
                f"train_step {inp.run_id} step {inp.step}: {exc} (evidence: "
                f"{guard_refusal_key(inp.run_id, inp.step)})",
                exc.evidence,
                type=type(exc).__name__,
                non_retryable=True,
            ) from exc
        except StorageError as err:  # an outage: retried by the run's policy, shown short in the UI
            raise retryable_storage_failure(f"train_step {inp.step}", err) from None
        return TrainStepResult(
            step=inp.step, policy_version=inp.step, reused_checkpoint=False, metrics=metrics
        )

    def _saved_metrics(self, inp: TrainStepInput) -> dict[str, float]:
        key = metrics_key(inp.run_id, inp.step)
        return json.loads(self.store.get(key)) if self.store.exists(key) else {}

    # ------------------------------------------------------------------ ranks > 1 (train_ranks.py)

    async def _train_ranks(self, inp: TrainStepInput) -> dict[str, float]:
        """One attempt: prepare its folder, run the ranks, then upload and COMMIT (only if all succeeded)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        attempt = Path(tempfile.mkdtemp(prefix=f"step-{inp.step:06d}-ranks-", dir=self.work_dir))
        try:
            job, lag = await asyncio.to_thread(self._rank_job, inp, attempt)
            await run_ranks(attempt, job)
            return await asyncio.to_thread(self._commit_ranks, inp, attempt / OUT_DIR, lag)
        finally:
            await asyncio.to_thread(shutil.rmtree, attempt, True)

    def _rank_job(self, inp: TrainStepInput, attempt: Path) -> tuple[RankJob, dict[str, float]]:
        """The attempt's inputs on local disk (previous checkpoint, verified; rows; episode records),
        and the batch's policy-lag metrics. PolicyLagError before any rank starts, as in one process."""
        world = inp.learner.ranks
        cuda = (self.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
        start_dir, model_dir = None, None
        if inp.step == 1:
            model_dir = self._base_model(inp.run_id, inp.model, attempt / "base-model")
        else:
            start = attempt / "start"
            state = download_checkpoint(self.store, inp.run_id, inp.step - 1, start)
            check_config(state, inp.learner, inp.run_id)
            start_dir, model_dir = start, start / MODEL_DIR
        rows_keys, records = self._batch_refs(inp)
        files, rows = [], []
        for i, key in enumerate(rows_keys):
            path = attempt / "rows" / f"{i:05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = self.store.get(key)
            path.write_bytes(data)
            files.append(str(path))
            rows += rows_from_parquet(data)
        if inp.max_policy_lag is not None:  # the run's staleness bound (trainer/off_policy.py)
            check_policy_lag(rows, inp.step - 1, inp.max_policy_lag)
        threads = self.rank_threads or max(1, torch.get_num_threads() // world)
        return RankJob(
            run_id=inp.run_id, step=inp.step, world=world, backend="nccl" if cuda else "gloo",
            device="cuda" if cuda else "cpu", threads=threads, config=inp.learner,
            model_dir=str(model_dir), start_dir=None if start_dir is None else str(start_dir),
            rows=files, episodes=records, is_cap=inp.off_policy_is_cap,
        ), lag_metrics(rows, inp.step - 1)  # fmt: skip

    def _commit_ranks(self, inp: TrainStepInput, out: Path, lag: dict[str, float]) -> dict[str, float]:
        metrics = {**json.loads((out / METRICS_FILE).read_text()), **lag}
        self.store.put(metrics_key(inp.run_id, inp.step), json.dumps(metrics, sort_keys=True).encode())
        self.store.put(episodes_key(inp.run_id, inp.step), (out / ADVANTAGES_FILE).read_bytes())
        if (out / GUARD_FILE).exists():  # skipped or accepted (LearnerConfig.guard_refusal)
            evidence = json.loads((out / GUARD_FILE).read_text())
            self._record_refusal(inp, evidence, inp.learner.guard_refusal)
        commit_files(self.store, inp.run_id, inp.step, local_checkpoint_files(out / CHECKPOINT_DIR))
        return metrics
