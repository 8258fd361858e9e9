"""Contracts of the episode boundary: the `EpisodeWorkflow`'s spec, its Updates (call, discard, close) and
queries (progress), its result, and the inputs and results of the activities that close it (reward,
materialize, staging cleanup, the harness runner).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from grove.contracts.generation import ObjectRef, PolicyRef, PromptSpec, _CompletionCarrier
from grove.contracts.harness import HarnessOutcome, HarnessSpec, TaskSpec
from grove.episodes import EpisodeRecord, FailureKind
from grove.ids import check_id
from grove.receipts import (
    AUXILIARY_KINDS,
    TRAINABLE_AUXILIARY_KINDS,
    CallKind,
    CallReceipt,
    ContextRecord,
    TokenDigests,
)
from grove.sampling import SamplingConfig

TrainAgents = Literal["all", "parent_only"]
# An external harness idle this long is closed; beyond a week an abandoned episode would hold its worker's
# cache and its run's step for nothing (and `inf` made every call and close fail with 500).
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600.0


class EpisodeSpecError(Exception):
    """An EpisodeSpec grove cannot run (a setting out of range, an id that cannot name stored things).

    Not a ValueError on purpose: pydantic raises it as itself, and the EpisodeWorkflow fails at once with
    it (workflows/episode.py EPISODE_FAILURE_TYPES) when a Temporal client started it with such a spec,
    instead of retrying its first workflow task for ever.
    """


class AuxiliaryTrainingError(Exception):
    """A setting naming auxiliary calls to train that grove cannot train (base of the kinds below).

    Not a ValueError on purpose: pydantic re-raises it as itself, so callers can catch it by name.
    """


class UnknownAuxiliaryKindError(AuxiliaryTrainingError):
    """`train_auxiliary` names something that is not an auxiliary call kind."""


class UntrainableAuxiliaryKindError(AuxiliaryTrainingError):
    """`train_auxiliary` names an auxiliary kind that is never trained (title, auxiliary)."""


def trained_auxiliary(value: object) -> list[str]:
    """The auxiliary call kinds a setting trains, checked: each a trainable auxiliary kind (`summary`),
    sorted, once each. `false` and null train none; `true` (every auxiliary call, titles included) is
    refused like `[title]`."""
    if value is False or value is None:
        return []
    if value is True:
        raise UntrainableAuxiliaryKindError(
            "train_auxiliary: true would train every auxiliary call, titles and helper calls included; "
            "only summary calls may be trained: set train_auxiliary: [summary] (or [] for none)"
        )
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise UnknownAuxiliaryKindError(
            f"train_auxiliary: {value!r} is not a list of auxiliary call kinds; expected [summary] or []"
        )
    kinds = {_auxiliary_kind(item) for item in items}
    return sorted(k.value for k in kinds)


def _auxiliary_kind(item: object) -> CallKind:
    name = str(item.value if isinstance(item, CallKind) else item).strip().lower()
    known = [k.value for k in AUXILIARY_KINDS]
    if name not in known:
        raise UnknownAuxiliaryKindError(
            f"train_auxiliary: {item!r} is not an auxiliary call kind; the kinds are {known} "
            "(grove/receipts.py CallKind; actions are always trained); only summary may be trained"
        )
    kind = CallKind(name)
    if kind not in TRAINABLE_AUXILIARY_KINDS:
        raise UntrainableAuxiliaryKindError(
            f"train_auxiliary: {name!r} calls are never trained: only a summary call is read by its "
            "agent (it is what the agent knows after the compaction), so only its text is judged by the "
            "episode's reward; remove it (only summary may be trained)"
        )
    return kind


# Which auxiliary call kinds train as their agent's actions (checked by `trained_auxiliary`)
TrainAuxiliary = Annotated[list[str], BeforeValidator(trained_auxiliary)]


class CallRequest(BaseModel):
    """The admission Update: one model call of one context."""

    call_id: str
    context_id: str
    kind: CallKind = CallKind.ACTION
    extends: str | None = None  # the call this continues; None: the context's root
    branch: bool = False
    prompt: PromptSpec
    sampling: SamplingConfig | None = None  # default: the episode's
    # The caller reads a large completion by reference (`CallResult.completion_ref`, capture/claims.py).
    # False, as every caller of before the claim check sends (the field is new to them): the completion
    # comes back inline whatever its size, so a gateway of an earlier version served by a newer episode
    # worker (a rolling deploy) still gets what it can decode.
    completion_by_ref: bool = False
    # The response counts only once the caller records its delivery (the `deliver` Update; the gateway,
    # ledger/delivery.py); False (native programs, callers of before it): delivered on completion.
    await_delivery: bool = False


class CallResult(_CompletionCarrier):
    """What the caller gets back: the response (inline or by reference), and how the ledger recorded it."""

    call_id: str  # the id that finally completed (a retry after a lost attempt has its own id)
    finish_reason: str
    policy_version: int
    digests: TokenDigests
    staging_key: str
    lost_attempts: list[str] = Field(default_factory=list)  # admitted, lost to a crash, discarded
    conversation_ref: ObjectRef | None = None  # a native chat call's stored Conversation (GenerateResult's)


class DiscardRequest(BaseModel):
    call_id: str
    reason: str


class CloseRequest(BaseModel):
    """The harness is done (external harnesses; native programs return instead).

    A close is final: the same close again is a no-op (idempotent, e.g. a retried HTTP request);
    a different one is refused (AlreadyClosed, HTTP 409). `close_digest` says "the same".
    """

    final_answer: str = ""
    outputs: dict[str, list[str]] = Field(default_factory=dict)
    failure: str | None = None
    # Whose failure it is, where the harness knows (grove could not serve it: "infrastructure"). Unset:
    # the workflow decides (workflows/episode_failures.py close_failure_kind).
    failure_kind: FailureKind | None = None


def close_digest(req: CloseRequest) -> str:
    """sha256 of a close's canonical JSON (sorted keys): equal digests = the same close."""
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class EpisodeSpec(BaseModel):
    run_id: str
    step: int = Field(ge=0)
    group_id: str
    episode_id: str
    index_in_group: int = Field(0, ge=0)
    task: TaskSpec
    harness: HarnessSpec = Field(default_factory=HarnessSpec)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    train_agents: TrainAgents = "all"
    train_auxiliary: TrainAuxiliary = Field(default_factory=list)  # RunConfig.train_auxiliary
    # External harness: a new agent whose requests name no spawner (x-grove-spawned-by) while the episode
    # already has a root agent: "warn" opens it as an independent root and lists it in the `summary`
    # query's warnings; "refuse" answers 400 UnspawnedAgentError before anything is admitted.
    unspawned_agents: Literal["warn", "refuse"] = "warn"
    max_lost_attempts: int = Field(2, ge=0)  # per call: new admissions after a crash
    inference_queue: str = "inference"  # the queue of the engine serving this run's policy
    # External harness: no call and no close for this long (workflow time) -> closed as failed.
    idle_timeout_s: float = Field(1800.0, gt=0, le=MAX_IDLE_TIMEOUT_S)
    # Updates (calls, open_context, discard) per workflow run before it continues-as-new with its
    # ledger; Temporal refuses more than 2,000 per run, and `close` must always fit after them.
    max_updates_per_run: int = Field(1000, ge=4, le=1900)
    # A ledger with more contexts + calls than this travels through the object store in pages of this
    # size (hand-over, materialization) instead of inline in a payload (a few hundred bytes per call;
    # 2 MB limit).
    ledger_page_items: int = Field(1000, ge=1, le=2000)
    # A paged ledger hands over only its live calls: per context its last `branch_window` calls and
    # its head's last `branch_window` ancestors, and calls still generating (ledger/settlement.py
    # `settle`). Older calls are settled: in the pages, still trained, but extending, branching from,
    # discarding or spawning from one is refused (409 SettledCallError). At least 2: a retry extends
    # the head's parent.
    branch_window: int = Field(16, ge=2, le=1000)
    keep_failed_staging: bool = False  # keep a failed episode's staged arrays (debugging)
    policy: PolicyRef | None = None  # the policy its calls need (None: whatever the engine serves)

    @field_validator("run_id", "group_id", "episode_id")
    @classmethod
    def _ids(cls, value: str, info) -> str:
        return check_id(value, info.field_name)

    @model_validator(mode="wrap")
    @classmethod
    def _one_error(cls, data, handler):
        """Every refusal of a spec is one EpisodeSpecError naming the fields (class docstring)."""
        try:
            return handler(data)
        except ValidationError as err:
            problems = "; ".join(_problem(e) for e in err.errors())
            raise EpisodeSpecError(f"episode spec refused: {problems}") from None


def _problem(error: dict, limit: int = 120) -> str:
    where = ".".join(map(str, error["loc"])) or "spec"
    if error["type"] == "value_error":  # grove's own message names the value
        return f"{where}: {error['msg'].removeprefix('Value error, ')}"
    got = repr(error.get("input"))
    return f"{where}: {error['msg']} (got {got if len(got) <= limit else got[:limit] + '...'})"


class RestoreProgress(BaseModel):
    """The restore of a paged ledger at the start of an episode's workflow run (EpisodeProgress.restore)."""

    pages_total: int
    pages_done: int = 0
    # the most pages unpacked within one workflow task: 1 when each task's work is one page, so no task
    # grows with the ledger (Temporal fails a workflow task that does not yield within 2 s)
    most_pages_per_task: int = 0
    task_history_length: int = -1  # the history length seen by the task that unpacked the last page
    pages_this_task: int = 0

    def page_done(self, history_length: int) -> RestoreProgress:
        """One more page unpacked in the workflow task that sees `history_length` events (one value per
        task: every task adds events, so tasks never share one)."""
        n = self.pages_this_task + 1 if history_length == self.task_history_length else 1
        return self.model_copy(
            update={
                "pages_done": self.pages_done + 1,
                "most_pages_per_task": max(self.most_pages_per_task, n),
                "task_history_length": history_length,
                "pages_this_task": n,
            }
        )


class EpisodeProgress(BaseModel):
    """The episode's `progress` query (and memo): where it stands, for the UI and the CLI."""

    status: str
    run_index: int  # workflow runs so far - 1 (each continue-as-new starts the next)
    updates_this_run: int
    updates_total: int
    max_updates_per_run: int
    in_flight: int  # Update handlers still running (calls generating)
    handing_over: bool  # draining before continue-as-new: new calls wait (the gateway retries them)
    idle_timeout_s: float
    last_activity: str  # ISO time (workflow clock) of the last Update start or end
    closed_by: str | None = None  # "harness" or "idle timeout"
    restore: RestoreProgress | None = None  # this run's restore of a paged ledger (None: carried inline)
    calls_admitted: int = 0  # calls the ledger admitted so far, settled ones included (all agents)


class HarnessRunInput(BaseModel):
    """The `run_harness` activity's input: the episode it drives (small: ids, task, harness options)."""

    spec: EpisodeSpec


class EpisodeResult(BaseModel):
    episode_id: str
    group_id: str
    task_id: str
    status: Literal["ok", "failed"]
    reward: float
    rows_key: str
    num_rows: int
    eligible_tokens: int
    counts: dict[str, int]  # calls per terminal state
    failure: str | None = None
    # the reward's components as the task family's scorer reports them (delegation: parent, workers)
    reward_details: dict[str, float] = Field(default_factory=dict)
    # who failed it (grove/episodes.py): "policy" counts in the group baseline with the run's
    # failure_reward, "infrastructure" is excluded from it; None when ok
    failure_kind: FailureKind | None = None
    # counts over the episode's ledger (workflows/step_metrics.py `call_stats`): calls offered tools
    # and how their completions parsed, rewrite (compaction) contexts
    call_stats: dict[str, int] = Field(default_factory=dict)
    # the distinct policy versions that generated the episode's calls (their receipts), ascending
    policy_versions: list[int] = Field(default_factory=list)
    # summary calls (compactions' summaries) whose tokens got loss, and those tokens (0 unless the run
    # trains summaries)
    summary_calls_trained: int = 0
    summary_tokens_trained: int = 0

    def record(self) -> EpisodeRecord:
        """What the learner needs of this episode (its rows are loaded from rows_key)."""
        return EpisodeRecord(
            episode_id=self.episode_id, group_id=self.group_id, reward=self.reward, status=self.status,
            # a failed result without a kind (recorded before kinds existed) is not blamed on the policy
            failure_kind=(self.failure_kind or "infrastructure") if self.status == "failed" else None,
            failure=self.failure,
            rows_key=self.rows_key, num_rows=self.num_rows,
        )  # fmt: skip


class RewardInput(BaseModel):
    task: TaskSpec
    outcome: HarnessOutcome
    # An external harness that closed without `outputs`: agent -> the call id of its last selected
    # action (Ledger.last_outputs); the reward activity reads those calls' responses from their chat
    # records (capture/records.py) into outcome.outputs before scoring.
    episode_id: str | None = None
    output_calls: dict[str, str] = Field(default_factory=dict)


class RewardResult(BaseModel):
    reward: float
    details: dict[str, float] = Field(default_factory=dict)


class MaterializeInput(BaseModel):
    episode_id: str
    group_id: str
    rows_key: str
    contexts: list[ContextRecord]
    receipts: list[CallReceipt]
    reward: float
    valid: bool  # False: a failed episode -> one masked placeholder row keeps its group intact
    failure: str | None = None
    train_agents: TrainAgents = "all"
    train_auxiliary: TrainAuxiliary = Field(default_factory=list)
    # A large ledger travels as snapshot pages (keys of LedgerPage objects), `contexts` and `receipts`
    # then stay empty: Temporal payloads stay small whatever the episode's length.
    ledger_pages: list[str] = Field(default_factory=list)
    # Set when the pages hold the ledger as it was *before* its close: materialize closes the joined
    # ledger itself (cancel_outstanding=True, this reason), exactly as the workflow did, so the close's
    # settlement of every call is not written through the history once more.
    close_reason: str | None = None
    # A settled episode (ledger/handover.py EpisodeCarry.settled): the pages of its earlier runs are
    # listed by this chain of LedgerIndex objects; `ledger_pages` are the last run's, joined after them.
    ledger_index: str | None = None


class MaterializeResult(BaseModel):
    rows_key: str
    num_rows: int
    eligible_tokens: int
    placeholder: bool
    # From the joined ledger pages, closed (None: the ledger came inline, or its pages could not be
    # read for a placeholder): the episode's result takes them from here once its workflow has settled
    # calls (dropped them from its state): accounting counts per terminal state, call_stats, versions.
    counts: dict[str, int] | None = None
    call_stats: dict[str, int] | None = None
    policy_versions: list[int] | None = None
    summary_calls_trained: int = 0  # summary calls that got loss (train_auxiliary: [summary])
    summary_tokens_trained: int = 0  # their completion tokens


class CleanStagingInput(BaseModel):
    episode_id: str
    keep: bool = False  # keep staged arrays (debugging a failed episode)
    extra_prefixes: list[str] = Field(default_factory=list)  # also deleted (ledger snapshot pages)


class CleanStagingResult(BaseModel):
    deleted: int
