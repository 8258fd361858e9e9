"""The `train_step` activity (trainer queue): one GRPO optimizer step per run step, idempotent.

The trainer worker keeps its Learner in memory between steps. A step whose checkpoint is already
committed is returned as it is (a retried or replayed activity never trains twice); a worker that
starts cold, or crashed mid-step, resumes from the committed checkpoint of the previous step (or the
base model for step 1), so the weights after step N are those of an uninterrupted run.
Metrics are written beside the checkpoint before its COMMIT marker.

The step's input lists every episode of the step as an EpisodeRecord (trainer/episodes.py), whatever
rows it produced: the rows of each record with a `rows_key` are loaded, and the records go to the
learner, whose group baselines and rollout count are over them (an episode with zero rows still
counts; a terminated child has no rows file and is an excluded infrastructure failure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from pathlib import Path

from temporalio import activity

from grove.contracts import TrainStepInput, TrainStepResult
from models.registry import ensure_model
from storage.base import ObjectStore
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.checkpoint_layout import commit_key, step_prefix
from trainer.episodes import EpisodeRecord
from trainer.learner import Learner
from trainer.rows import Row, rows_from_parquet

HEARTBEAT_EVERY_S = 10.0


def metrics_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + "metrics.json"


def episodes_key(run_id: str, step: int) -> str:
    """Per episode of the step: status, failure kind, baseline reward, advantage (for inspection)."""
    return step_prefix(run_id, step) + "episodes.json"


class TrainerActivities:
    def __init__(self, store: ObjectStore, work_dir: Path, device: str | None = None) -> None:
        self.store = store
        self.work_dir = Path(work_dir)
        self.device = device
        self.learner: Learner | None = None
        self.run_id: str | None = None

    def _learner_before(self, inp: TrainStepInput) -> Learner:
        """The learner holding the weights of version inp.step - 1."""
        have = self.learner
        same_run = have is not None and self.run_id == inp.run_id and have.config == inp.learner
        if same_run and have.step_count == inp.step - 1:
            return have
        if inp.step == 1:
            learner = Learner(ensure_model(inp.model), inp.learner, device=self.device)
        else:
            dest = Path(tempfile.mkdtemp(prefix=f"step-{inp.step - 1:06d}-", dir=self.work_dir))
            learner = load_checkpoint(
                self.store, inp.run_id, inp.step - 1, inp.learner, dest, device=self.device
            )
        self.learner, self.run_id = learner, inp.run_id
        return learner

    def _rows(self, keys: list[str]) -> list[Row]:
        return [row for key in keys for row in rows_from_parquet(self.store.get(key))]

    def _batch(self, inp: TrainStepInput) -> tuple[list[Row], list[EpisodeRecord] | None]:
        """The step's rows and episode records (rows-only when the input names no records)."""
        if not inp.episodes:
            return self._rows(inp.row_keys), None
        # Only an episode the learner trains or scores needs its rows: an excluded one's (if any) stay
        # unread, so a file that never got written (terminated child) is not an error.
        keys = sorted(e.rows_key for e in inp.episodes if e.rows_key is not None and e.in_baseline)
        records = [e if e.in_baseline else e.model_copy(update={"num_rows": None}) for e in inp.episodes]
        return self._rows(keys), records

    def _train(self, inp: TrainStepInput) -> dict[str, float]:
        learner = self._learner_before(inp)
        metrics = learner.step(*self._batch(inp))
        values = {k: float(v) for k, v in metrics.model_dump().items() if isinstance(v, int | float)}
        self.store.put(metrics_key(inp.run_id, inp.step), json.dumps(values, sort_keys=True).encode())
        episodes = {e: dataclasses.asdict(a) for e, a in learner.last_advantages.items()}
        self.store.put(episodes_key(inp.run_id, inp.step), json.dumps(episodes, sort_keys=True).encode())
        save_checkpoint(self.store, inp.run_id, learner)
        return values

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        if self.store.exists(commit_key(inp.run_id, inp.step)):
            return TrainStepResult(
                step=inp.step,
                policy_version=inp.step,
                reused_checkpoint=True,
                metrics=self._saved_metrics(inp),
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        task = asyncio.create_task(asyncio.to_thread(self._train, inp))
        while not task.done():  # heartbeat while the step runs in a thread (a dead worker times out)
            activity.heartbeat({"run": inp.run_id, "step": inp.step, "rows": len(inp.row_keys)})
            await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
        metrics = task.result()
        return TrainStepResult(
            step=inp.step, policy_version=inp.step, reused_checkpoint=False, metrics=metrics
        )

    def _saved_metrics(self, inp: TrainStepInput) -> dict[str, float]:
        key = metrics_key(inp.run_id, inp.step)
        return json.loads(self.store.get(key)) if self.store.exists(key) else {}
