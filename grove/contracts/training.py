"""Contracts of the training boundary: the `train_step` activity (one GRPO step of a run), weight
publication to the engines, and per-step tracking.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from grove.contracts.run import StepRecord, TrackingConfig
from grove.episodes import EpisodeRecord
from grove.learner_config import LearnerConfig


class TrainStepInput(BaseModel):
    run_id: str
    step: int  # 1-based optimizer step N; produces policy version N
    model: str  # base model name or folder (the learner starts from it at step 0)
    row_keys: list[str]
    learner: LearnerConfig
    # Off-policy bounds of the run (RunConfig): a loss token sampled by a version older than
    # step - 1 - max_policy_lag is refused; older-than-current tokens get truncated IS (trainer/loss.py).
    max_policy_lag: int | None = None  # None: not checked (callers before it)
    off_policy_is_cap: float = 2.0
    # One record per episode of the step, rows or not (grove/episodes.py); the learner's baseline,
    # rollout count and rollouts_per_step are over these. Empty: rows-only (older callers).
    episodes: list[EpisodeRecord] = Field(default_factory=list)


class TrainStepResult(BaseModel):
    step: int
    policy_version: int
    reused_checkpoint: bool
    metrics: dict[str, float]


class TrackStepInput(BaseModel):
    run_id: str
    record: StepRecord
    tracking: TrackingConfig


class TrackStepResult(BaseModel):
    scalars: int  # points written per sink (one per tag)
    tensorboard_file: str | None = None
    mlflow: bool = False


class PublishInput(BaseModel):
    run_id: str
    version: int = Field(ge=0)  # the checkpoint step whose weights to load; == the new policy version
    base_model: str = "tiny"  # what version 0 is: the run's base model (name or folder)


class PublishResult(BaseModel):
    version: int
    previous_version: int
    seconds: float


# The `stage_base_model` activity: the run's base model (policy version 0) written to the object store once,
# by the trainer host, when the run starts (trainer/base_model.py says why).
class StageBaseModelInput(BaseModel):
    run_id: str
    model: str  # RunConfig.model: a name or a folder, resolved on the trainer host


class StageBaseModelResult(BaseModel):
    files: int  # in the committed manifest
    written: bool  # False: the base was committed already (a retry, a resumed run)
