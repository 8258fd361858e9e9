"""Contracts of the run boundary: `RunConfig` (what a run is), the run workflow's carried state and result,
its per-step records, evaluation records and the engines' status reports.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grove.contracts.episode import TrainAgents, TrainAuxiliary
from grove.contracts.harness import RUNNER_KINDS, HarnessSpec
from grove.ids import RUN_ID_PARTS, check_id
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig

# An unset episode_timeout_s of a launched harness: its launches, plus this for what follows the last
# (closing, reward, materialization)
LAUNCHED_EPISODE_MARGIN_S = 600.0


class EpisodeTimeoutError(Exception):
    """A RunConfig whose episode_timeout_s is shorter than its launched harness may run.

    Not a ValueError on purpose: pydantic re-raises it as itself, so callers can catch it by name.
    """


class SamplingMismatchError(Exception):
    """A RunConfig whose learner names a temperature/top_p other than its sampling's.

    Not a ValueError on purpose: pydantic re-raises it as itself, so callers can catch it by name.
    """


class TrackingConfig(BaseModel):
    """Where a run's per-step metrics go besides its step records (activities/tracking.py)."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field(
        "runs",
        description="directory on the io worker's machine (relative: to its working directory); "
        "TensorBoard event files go to <dir>/<run_id>/tensorboard/, one per step",
    )
    tensorboard: bool = Field(True, description="write TensorBoard event files (offline, no account)")
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI (needs `pip install mlflow` on the io worker); null: no MLflow"
    )


DEFAULT_MAX_MODEL_LEN = 2048


DEFAULT_KV_CACHE_BYTES = 256 * 2**20


class EngineLimits(BaseModel):
    """The context and memory limits of the inference engine that serves a run (`grove worker` flags
    --max-model-len, --max-num-batched-tokens, --kv-cache-bytes). Checked against the model when the
    engine starts (activities/engine_config.py `check_engine_limits`): a context longer than the model's
    positions is refused, never served with NaN logits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_model_len: int = Field(
        DEFAULT_MAX_MODEL_LEN,
        ge=16,
        description="tokens of one call's context, prompt and completion together; at most the model's "
        "max_position_embeddings (tiny: 2048, tiny-tools: 32768)",
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=16,
        description="tokens one engine step may schedule; null: max(max_model_len, 2048). On CPU (no "
        "chunked prefill) at least max_model_len",
    )
    kv_cache_bytes: int = Field(
        DEFAULT_KV_CACHE_BYTES,
        ge=16 * 2**20,
        description="bytes of the engine's KV cache; must hold at least one max_model_len context",
    )


class RunConfig(BaseModel):
    """One training run. Written as YAML (examples/*.yaml, `grove run schema`) or JSON; unknown keys
    are refused so a misspelt field never silently takes its default."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        description="the run's workflow id; starting the same run id again re-attaches to it (resume)"
    )
    model: str = Field(
        "tiny", description="base policy: tiny | tiny-random | smollm2 | a Hugging Face causal-LM folder"
    )

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        return check_id(value, "run_id", RUN_ID_PARTS)  # it names the run's episodes and stored objects

    seed: int = Field(0, description="data order seed: the tasks of step N are a pure function of (seed, N)")
    steps: int = Field(20, ge=1, description="optimizer steps; step N produces policy version N")
    task_family: str = Field(
        "delegation", description="task family in harnesses.programs.TASK_FAMILIES (tasks and reward)"
    )
    num_tasks: int = Field(64, ge=1, description="training tasks of the family: indices 0..num_tasks-1")
    tasks_per_step: int = Field(2, ge=1, description="tasks per optimizer step (GRPO groups per step)")
    group_size: int = Field(4, ge=1, description="episodes per task per step (G of GRPO)")
    harness: HarnessSpec = Field(default_factory=HarnessSpec, description="who drives each episode")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="how every model call of the run's episodes samples"
    )
    train_agents: TrainAgents = Field(
        "all",
        description="whose actions get loss: all (parent and workers) or parent_only (workers' calls "
        "are recorded, never trained)",
    )
    # Off by default (docs/design.md, "Summaries"): a summary call's prompt is its agent's whole context,
    # so training it adds a row as long as the context it replaces; a run opts in.
    train_auxiliary: TrainAuxiliary = Field(
        default_factory=list,
        description="auxiliary call kinds trained as their agent's actions: [summary] trains each "
        "compaction's summary call (its own tokens, loss once, its agent's advantage); [] trains none. "
        "title and auxiliary (other helper calls) are never trained and are refused, as is an unknown kind",
    )
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="the GRPO learner")
    engine: EngineLimits = Field(
        default_factory=EngineLimits,
        description="limits of the inference engine serving the run (its workers get them as flags)",
    )
    continue_as_new_every: int = Field(
        5, ge=1, description="the run workflow continues as new every this many steps (bounds history)"
    )
    carried_history_steps: int = Field(
        100,
        ge=1,
        description="step records the run workflow keeps in its state (carried through continue-as-new, "
        "returned in its result); older ones are in the object store at runs/{run_id}/steps/ (bounds "
        "the state under Temporal's 2 MB payload limit however many steps)",
    )
    # Asynchronous GRPO (docs/rollout-scale.md): episodes of step S may start once version S - 1 - k is
    # committed, so later steps roll out while the learner trains; every trained token was sampled at
    # most k versions before the weights its step updates. 0: synchronous, exactly as before.
    max_policy_lag: int = Field(
        0,
        ge=0,
        le=8,
        description="bounded staleness k: step S's episodes start once version S-1-k is committed and "
        "may be sampled by versions S-1-k .. S-1; 0 = synchronous (each step rolls out on the previous "
        "step's weights, exactly reproducible)",
    )
    off_policy_is_cap: float = Field(
        2.0,
        ge=1.0,
        description="truncated importance sampling cap C for tokens sampled by an older version than the "
        "weights being updated: their surrogate is weighted by min(pi_learner / pi_behaviour, C) "
        "(trainer/loss.py); unused at max_policy_lag 0",
    )
    # One engine holds one policy: runs that train at the same time need their own inference queues.
    inference_queue: str = Field(
        "inference",
        description="task queue of the engine serving this run's policy; runs training at the same "
        "time need their own (grove worker --inference-queue)",
    )
    # evaluation on held-out tasks (workflows/evaluation.py)
    eval_every: int = Field(
        0, ge=0, description="evaluate the policy every this many steps (after the step's update); 0: never"
    )
    eval_tasks: int = Field(
        8,
        ge=1,
        description="held-out tasks of the family, indices num_tasks..num_tasks+eval_tasks-1 (never trained "
        "on), one episode each, in index order",
    )
    eval_sampling: SamplingConfig | None = Field(
        None, description="how evaluation episodes sample; null: as `sampling`"
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="experiment tracking (TensorBoard, optional MLflow)"
    )
    # The server enforces it, so it holds when the episode's own code cannot run: an episode whose
    # workflow tasks fail on every attempt (docs/reliability.md) would otherwise stall its step for good.
    episode_timeout_s: float | None = Field(
        3600.0,
        gt=0,
        description="longest an episode (training or evaluation) may take, end to end, continue-as-new "
        "included; Temporal times out one that runs longer and it counts as an infrastructure failure "
        "(no rows, out of its group's baseline), so a stuck episode cannot stall the run. Launched "
        "harnesses (opencode, codex, python) need more than harness.deadline_s x harness.max_launches; left "
        "unset, theirs is that + 600 s when it exceeds 3600. null: no bound",
    )

    @model_validator(mode="after")
    def _episode_bound_fits_the_harness(self) -> RunConfig:
        bound, harness = self.episode_timeout_s, self.harness
        if bound is None or harness.kind not in RUNNER_KINDS:
            return self
        launches = harness.deadline_s * harness.max_launches
        if "episode_timeout_s" not in self.model_fields_set:
            # unset (a config, or a run state written before the field existed): a bound that fits;
            # refusing here would fail the resumed run's workflow task on a field it never chose
            self.episode_timeout_s = max(bound, launches + LAUNCHED_EPISODE_MARGIN_S)
            return self
        if bound <= launches:
            raise EpisodeTimeoutError(
                f"run {self.run_id!r}: episode_timeout_s={bound:g} would time out an episode whose "
                f"{harness.kind} harness may still be running legitimately (harness.deadline_s "
                f"{harness.deadline_s:g} x harness.max_launches {harness.max_launches} = {launches:g} s); "
                "raise episode_timeout_s above that, or lower the harness's deadline or launches"
            )
        return self

    @model_validator(mode="after")
    def _learner_agrees_with_sampling(self) -> RunConfig:
        """learner.temperature/top_p are only a check (grove/learner_config.py): refused if they differ."""
        for name in ("temperature", "top_p"):
            learner, sampled = getattr(self.learner, name), getattr(self.sampling, name)
            if learner is not None and learner != sampled:
                raise SamplingMismatchError(
                    f"run {self.run_id!r}: learner.{name}={learner} but sampling.{name}={sampled}; the "
                    "learner scores each token under the sampling its call was generated with (recorded per "
                    f"row span); learner.{name} is only a check of it: make them equal or drop it"
                )
        return self


class EvalRecord(BaseModel):
    """The held-out evaluation done after a step's update: scores of policy version `policy_version`."""

    policy_version: int
    mean_reward: float  # over the episodes that finished ok
    episodes: int
    failed_episodes: int
    reward_components: dict[str, float] = Field(default_factory=dict)
    # the versions that served the evaluation's calls, from their receipts: [policy_version] when the
    # whole evaluation scored the policy it names (empty in records made before it was recorded)
    served_versions: list[int] = Field(default_factory=list)


class StepRecord(BaseModel):
    step: int
    mean_reward: float
    episodes: int
    failed_episodes: int
    policy_version: int
    # failed episodes per kind ("policy": in the baseline at failure_reward, "infrastructure": excluded)
    failures_by_kind: dict[str, int] = Field(default_factory=dict)
    excluded_episodes: int = 0  # left out of every group baseline (infrastructure failures)
    metrics: dict[str, float] = Field(default_factory=dict)
    # mean over the step's ok episodes of each reward component (EpisodeResult.reward_details)
    reward_components: dict[str, float] = Field(default_factory=dict)
    eval: EvalRecord | None = None  # set on steps where the run evaluated (RunConfig.eval_every)
    # rollout statistics of the step's episodes (workflows/step_metrics.py) and wall times in seconds
    rollout: dict[str, float] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


class EngineStatus(BaseModel):
    """What one inference worker's engine reports about itself (activities/engine_status.py)."""

    engine_id: str  # host-pid of the inference worker process
    queue: str  # the inference task queue it serves
    run_id: str | None  # the run whose policy it serves (None: its start-up weights)
    version: int
    in_flight: int  # generations admitted and not finished
    publishing: bool  # a weight load is in progress
    calls: int  # generations admitted since it started
    busy_s: float  # seconds with at least one generation in flight since it started
    up_s: float  # seconds since it started
    written_at: float  # unix time of this report
    age_s: float | None = None  # set by readers: seconds since it was written


class RunLive(BaseModel):
    """The moving parts of a run, for its `progress` query (not needed to resume it)."""

    training_step: int | None = None  # the step the learner trains now
    committed_version: int = 0  # the newest committed policy version
    rolling_out: list[int] = Field(default_factory=list)  # steps whose episodes run now
    lag: int = (
        0  # how many versions the newest rolling-out step may be behind: max(rolling_out) - 1 - committed
    )
    max_policy_lag: int = 0
    engines: list[EngineStatus] = Field(default_factory=list)  # as of `engines_as_of_step`
    engines_as_of_step: int | None = None


class RunState(BaseModel):
    """Everything the run needs to continue: carried whole through continue-as-new. Bounded: `history`
    holds the last `config.carried_history_steps` records; those of steps before `history_from` are in
    the object store (grove/store_layout.py `step_record_key`)."""

    config: RunConfig
    next_step: int = Field(1, ge=1)  # steps count from 1: step N produces policy version N
    history: list[StepRecord] = Field(default_factory=list)  # steps history_from, history_from + 1, ...
    history_from: int = Field(1, ge=1)  # the step of history[0]; earlier records are in the store
    live: RunLive | None = None  # progress only: set by the running workflow, never read to resume

    @property
    def steps_recorded(self) -> int:
        return self.history_from - 1 + len(self.history)


class RunResult(BaseModel):
    run_id: str
    steps: int  # steps recorded in all (history holds the last ones, from history_from)
    history: list[StepRecord]
    cancelled: bool = False  # stopped by a cancel request before its last step; the same run id resumes
    history_from: int = Field(1, ge=1)  # the step of history[0]; earlier records are in the store


class ArchiveStepsInput(BaseModel):
    """Step records the run's state stops carrying, written to the store (grove/store_layout.py
    `step_record_key`)."""

    run_id: str
    records: list[StepRecord]
