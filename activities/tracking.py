"""The `track_step` activity (io queue): a finished step's scalars to TensorBoard, and to MLflow if asked.

Idempotent, so a retried activity or a replayed step never duplicates a point:
- TensorBoard: one event file per step under a deterministic name,
  `<tracking.dir>/<run_id>/tensorboard/events.out.tfevents.step-NNNNNN.grove`, written to a temporary
  file and renamed over it: a retry replaces the step's file, never adds a second one. `tensorboard
  --logdir <tracking.dir>` shows every run (its loader reads a directory's event files in name order).
- MLflow (optional; `pip install mlflow` on the io worker and set `tracking.mlflow_uri`): one MLflow
  run per grove run (found by its `grove_run_id` tag), and a key's point at a step is logged only if
  that step has none yet.
The files live on the io worker's machine: at scale, point `tracking.dir` at a shared filesystem, or
read the same numbers from the run's step records (`grove run status --json`, the `progress` query).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from grove.contracts import TrackingConfig, TrackStepInput, TrackStepResult
from workflows.step_metrics import step_scalars


class MlflowMissingError(RuntimeError):
    """tracking.mlflow_uri is set but the io worker cannot import mlflow."""


def event_file(tracking: TrackingConfig, run_id: str, step: int) -> Path:
    return Path(tracking.dir) / run_id / "tensorboard" / f"events.out.tfevents.step-{step:06d}.grove"


def write_tensorboard(path: Path, step: int, scalars: dict[str, float], wall_time: float) -> None:
    """One event file holding the step's scalars, replaced atomically."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".grove")
    try:
        with os.fdopen(fd, "wb") as f:
            writer = RecordWriter(f)
            writer.write(Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())
            summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
            writer.write(Event(wall_time=wall_time, step=step, summary=summary).SerializeToString())
            writer.flush()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def log_mlflow(uri: str, run_id: str, step: int, scalars: dict[str, float]) -> None:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as err:
        raise MlflowMissingError(
            f"tracking.mlflow_uri={uri!r} but mlflow is not installed on this io worker: "
            "`pip install mlflow`, or set tracking.mlflow_uri to null"
        ) from err
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("grove") or client.get_experiment(
        client.create_experiment("grove")
    )
    found = client.search_runs([experiment.experiment_id], f"tags.grove_run_id = '{run_id}'", max_results=1)
    mlrun = found[0] if found else client.create_run(experiment.experiment_id, run_name=run_id,
                                                     tags={"grove_run_id": run_id})  # fmt: skip
    for key, value in scalars.items():
        if any(m.step == step for m in client.get_metric_history(mlrun.info.run_id, key)):
            continue  # already logged by an earlier attempt
        client.log_metric(mlrun.info.run_id, key, value, step=step)


@activity.defn(name="track_step")
def track_step(inp: TrackStepInput) -> TrackStepResult:
    scalars = step_scalars(inp.record)
    result = TrackStepResult(scalars=len(scalars))
    if inp.tracking.tensorboard:
        path = event_file(inp.tracking, inp.run_id, inp.record.step)
        write_tensorboard(path, inp.record.step, scalars, time.time())
        result.tensorboard_file = str(path)
    if inp.tracking.mlflow_uri:
        try:
            log_mlflow(inp.tracking.mlflow_uri, inp.run_id, inp.record.step, scalars)
        except MlflowMissingError as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
        result.mlflow = True
    return result
