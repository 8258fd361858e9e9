"""Inputs and results of grove's workflows, updates and activities: the Temporal boundary.

One model in and one model out per workflow, update and activity, so fields can be added later without
breaking callers. Pure (pydantic + stdlib + other pure grove models): the workflow sandbox imports it.
Token arrays never appear here except a small completion's ids (inline below COMPLETION_INLINE_MAX bytes,
else the completion travels as a reference: `Completion`) and a new observation suffix; prompts travel
as references to staged arrays.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grove.episodes import EpisodeRecord, FailureKind
from grove.learner_config import LearnerConfig
from grove.receipts import CallKind, CallReceipt, ContextRecord, TokenDigests, ToolCallOutcome
from grove.sampling import SamplingConfig, SamplingProcessing

TrainAgents = Literal["all", "parent_only"]


# ------------------------------------------------------------------------------------------ tasks


class TaskSpec(BaseModel):
    """One dataset item: a task family and the parameters of this instance."""

    model_config = ConfigDict(frozen=True)

    family: str
    task_id: str
    params: dict[str, Any] = Field(default_factory=dict)


HarnessKind = Literal["native", "external", "opencode", "python"]
# Kinds whose process the run owns: a `run_harness` activity on the harness queue launches it per episode
# (activities/harness.py); it talks to the episode through the gateway like a hand-run external harness.
RUNNER_KINDS: frozenset[str] = frozenset({"opencode", "python"})
# Kinds whose harness may close without outputs: the reward then reads each agent's last answer from the
# ledger (OpenCode's runner reads them from its events).
LEDGER_OUTPUT_KINDS: frozenset[str] = frozenset({"external", "python"})
_ENTRY = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class OpenCodeOptions(BaseModel):
    """How the harness runner sets OpenCode up for each episode (harnesses/opencode.py writes its
    `opencode.json`). Agents and the first message come from the task family unless given here."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field("1.18.33", description="opencode-ai npm version (infra/opencode.sh installs it)")
    agents: dict[str, dict[str, Any]] | None = Field(
        None,
        description="opencode.json `agent` section (e.g. a restricted primary agent with only the `task` "
        "tool and a `worker` subagent); null: the task family's (harnesses/opencode.py TASK_SETUPS)",
    )
    default_agent: str | None = Field(None, description="opencode.json `default_agent`; null: the family's")
    message: str | None = Field(None, description="the first user message; null: the task family's")
    context_limit: int = Field(
        2048,
        ge=256,
        description="`limit.context` declared to OpenCode: it compacts a session when the usage grove "
        "reports reaches it minus min(20000, output limit); keep it well above OpenCode's fixed prompt "
        "or it loops",
    )
    output_limit: int | None = Field(
        None, ge=1, description="`limit.output` (OpenCode's max_tokens); null: the run's sampling.max_tokens"
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long OpenCode waits for a response to start, and between its chunks (its "
        "provider `headerTimeout` / `chunkTimeout`); null: no limit, the launch's deadline_s bounds it. "
        "The gateway answers when generation ends, so a call queued behind a GRPO group's long prompts "
        "can outlast OpenCode's own 5-minute default; OpenCode would then re-send it while the first is "
        "still generating, be refused (409) and give up: the episode fails",
    )
    agent_context_limits: dict[str, Annotated[int, Field(ge=256)]] = Field(
        default_factory=dict,
        description="`limit.context` of single agents (agent name -> tokens), e.g. {worker: 400} so that "
        "the subagents compact while the lead does not: each such agent gets a model entry of its own in "
        "opencode.json (the same served model) with this limit; the same rule as context_limit applies",
    )


class PythonHarnessOptions(BaseModel):
    """A Python harness program the runner launches per episode (harnesses/python_harness.py): the
    function `entry` gets the episode's gateway URL, token, launch number and task, and returns the final
    answer (or {"final_answer", "outputs"}). It runs in its own interpreter, isolated like OpenCode."""

    model_config = ConfigDict(extra="forbid")

    entry: str | None = Field(
        None,
        pattern=_ENTRY,
        description="`package.module:function` importable in the harness process, e.g. "
        "harnesses.langgraph_delegation:run (a LangGraph program) or harnesses.agents_sdk_delegation:run",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="passed to the program as `harness.options` (its own settings)"
    )


class HarnessSpec(BaseModel):
    """Who drives the episode: a native program inside the workflow, an external harness (gateway), or
    a harness process the run launches per episode (`opencode`, `python`; activities/harness.py)."""

    model_config = ConfigDict(extra="forbid")

    kind: HarnessKind = Field(
        "native",
        description="native: a program run inside the episode workflow (harnesses/programs.py); "
        "external: a harness process that talks to the episode through the gateway, started by someone "
        "else (`grove episode start --external`); opencode: the run launches stock OpenCode per episode "
        "on the harness queue (activities/harness.py), talking through the gateway; python: the run "
        "launches a Python harness program per episode the same way (`python.entry`)",
    )
    program: str = Field(
        "delegation", description="native: the program's name in harnesses.programs.PROGRAMS"
    )
    max_turns: int = Field(4, ge=1, description="most model turns the parent agent may take")
    opencode: OpenCodeOptions = Field(
        default_factory=OpenCodeOptions, description="opencode: how each episode's OpenCode is configured"
    )
    python: PythonHarnessOptions = Field(
        default_factory=PythonHarnessOptions, description="python: the program each episode runs"
    )
    deadline_s: float = Field(
        900.0,
        gt=0,
        description="launched harnesses: wall-clock limit of one launch (then its process group "
        "is killed and the episode closes as failed)",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0,
        description="launched harnesses: a runner silent this long is presumed dead; the launch "
        "is retried (relaunched, answered from the recorded calls while its requests match them)",
    )
    max_launches: int = Field(
        3, ge=1, description="launched harnesses: launches per episode (the first + relaunches)"
    )

    @model_validator(mode="after")
    def _python_needs_an_entry(self) -> HarnessSpec:
        if self.kind == "python" and self.python.entry is None:
            raise ValueError(
                "harness.kind is 'python' but harness.python.entry is not set: name the program's "
                "function as package.module:function (e.g. harnesses.langgraph_delegation:run)"
            )
        return self


# ------------------------------------------------------------------------------------------ calls


class ChatPrompt(BaseModel):
    """A chat-rendered prompt: the whole conversation so far (text), rendered by the activity.

    With `parent_call_id`, the activity splices the parent's exact tokens (prompt + completion) and
    renders only the new messages after them (chat/render.py); `parent_messages` are the
    messages the parent's prompt was rendered from.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    parent_messages: list[dict[str, Any]] | None = None
    # The assistant message the parent's caller got (the gateway's chat record); when absent the
    # activity derives it from the parent's completion with the engine's tool-call parser.
    parent_response: dict[str, Any] | None = None


class ObjectRef(BaseModel):
    """A claim check: an object in the store, named by key and verified by sha256 when read."""

    key: str
    sha256: str
    size: int = Field(ge=0)


class Conversation(BaseModel):
    """What one native chat call saw and answered: its prompt's messages and tools, and the assistant
    message its caller got. The generate activity stores it (gateway/claims.py `stash_conversation`)
    so the call's continuation can name it instead of carrying the conversation again."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    response: dict[str, Any]


class ChatDelta(BaseModel):
    """A native chat continuation without the conversation it continues: the activity reads the parent
    call's `Conversation` and renders `parent.messages + [parent.response] + messages` with
    `parent_messages = parent.messages` and the parent's tools, the ChatPrompt the native harness would
    otherwise send whole. What crosses Temporal per call is the new messages, not the conversation."""

    parent_conversation: ObjectRef
    messages: list[dict[str, Any]]  # after the parent's reply: user turns, tool results


class PromptSpec(BaseModel):
    """How the generate activity builds a call's prompt ids, exactly one of three ways.

    A chat prompt travels as `chat_ref` (the ChatPrompt's JSON in the object store) rather than inline
    `chat`: a request's messages can be megabytes, and Temporal payloads and history must stay small
    (DESIGN.md section 10). The gateway stores it (gateway/claims.py); the activity loads and verifies it.
    The native harness, which cannot write the store (it is workflow code), sends a continuation as
    `chat_delta` (its new messages and the parent's stored `Conversation`), its roots as `chat`.
    """

    ids: list[int] | None = None  # a context root given as tokens
    suffix_ids: list[int] | None = None  # parent prompt + parent completion + these (a continuation)
    chat: ChatPrompt | None = None  # rendered with the model's chat template
    chat_ref: ObjectRef | None = None  # the same, claim-checked: a ChatPrompt JSON in the object store
    chat_delta: ChatDelta | None = None  # the same, as new messages after a stored parent Conversation
    parent_call_id: str | None = None
    parent_staging_key: str | None = None


class CallRequest(BaseModel):
    """The admission Update: one model call of one context."""

    call_id: str
    context_id: str
    kind: CallKind = CallKind.ACTION
    extends: str | None = None  # the call this continues; None: the context's root
    branch: bool = False
    prompt: PromptSpec
    sampling: SamplingConfig | None = None  # default: the episode's
    # The caller reads a large completion by reference (`CallResult.completion_ref`, gateway/claims.py).
    # False, as every caller of before the claim check sends (the field is new to them): the completion
    # comes back inline whatever its size, so a gateway of an earlier version served by a newer episode
    # worker (a rolling deploy) still gets what it can decode.
    completion_by_ref: bool = False
    # The response counts only once the caller records its delivery (the `deliver` Update; the gateway,
    # workflows/delivery.py); False (native programs, callers of before it): delivered on completion.
    await_delivery: bool = False


# Completions whose inline form (ids + text + chat message, JSON) is larger than this many bytes travel
# as a claim check (`completion_ref`): the generate activity stores the `Completion` and its result, the
# `call` Update's result and the history carry a ~0.2 KB reference. Below it, storing would cost a write
# and a read per call to save less history than the reference adds back; docs/reliability.md has the
# measurement (the default max_tokens 256 stays inline).
COMPLETION_INLINE_MAX = 4096


class Completion(BaseModel):
    """A call's response as its caller sees it: the completion decoded, and parsed as a chat message.
    The token ids are the staged arrays' (`staging_key`); this is what a claim check stores."""

    text: str
    assistant_message: dict[str, Any]


class _CompletionCarrier(BaseModel):
    """A completion inline (`completion_ids`, `text`, `assistant_message`) or by reference
    (`completion_ref`: a `Completion` JSON in the object store, read with gateway/claims.py)."""

    # None when not carried (by reference; a native program's loaded completion): the ids are staged
    # at staging_key
    completion_ids: list[int] | None = None
    text: str | None = None
    assistant_message: dict[str, Any] | None = None
    completion_ref: ObjectRef | None = None

    @model_validator(mode="after")
    def _inline_or_ref(self) -> _CompletionCarrier:
        inline = (self.text, self.assistant_message, self.completion_ids)
        if self.completion_ref is None and None in inline[:2]:
            raise ValueError("a completion needs text and assistant_message inline, or completion_ref")
        if self.completion_ref is not None and inline != (None, None, None):
            raise ValueError("a completion is inline or by reference (completion_ref), not both")
        return self

    def inline_completion(self) -> Completion | None:
        """The completion when it travelled inline (None: read `completion_ref` from the store)."""
        if self.completion_ref is not None:
            return None
        return Completion(text=self.text, assistant_message=self.assistant_message)


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


def close_digest(req: CloseRequest) -> str:
    """sha256 of a close's canonical JSON (sorted keys): equal digests = the same close."""
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# ------------------------------------------------------------------------------------------ episode


class PolicyRef(BaseModel):
    """The policy a call must be served with: the run's lineage and the oldest version it allows.

    An engine serving the call first loads the run's latest committed checkpoint when it serves another
    run, or a version older than `min_version`, or when a newer checkpoint of the run is committed
    (activities/follow.py). None on a call: served by whatever the engine holds (callers before it).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    min_version: int = Field(ge=0)  # the run's step S allows versions >= S - 1 - max_policy_lag
    base_model: str = "tiny"  # what version 0 is: the run's base model (name or folder)
    # the newest version the call may use; None: the run's latest committed. An evaluation of step N
    # pins min_version = max_version = N: it scores exactly that policy, even after N + 1 commits.
    max_version: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _range(self) -> PolicyRef:
        if self.max_version is not None and self.max_version < self.min_version:
            raise ValueError(
                f"PolicyRef of run {self.run_id!r}: max_version {self.max_version} < min_version "
                f"{self.min_version}; no version can serve the call"
            )
        return self


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
    train_auxiliary: bool = False
    # External harness: a new agent whose requests name no spawner (x-grove-spawned-by) while the episode
    # already has a root agent: "warn" opens it as an independent root and lists it in the `summary`
    # query's warnings; "refuse" answers 400 UnspawnedAgentError before anything is admitted.
    unspawned_agents: Literal["warn", "refuse"] = "warn"
    max_lost_attempts: int = Field(2, ge=0)  # per call: new admissions after a crash
    inference_queue: str = "inference"  # the queue of the engine serving this run's policy
    # External harness: no call and no close for this long (workflow time) -> closed as failed.
    idle_timeout_s: float = Field(1800.0, gt=0)
    # Updates (calls, open_context, discard) per workflow run before it continues-as-new with its
    # ledger; Temporal refuses more than 2,000 per run, and `close` must always fit after them.
    max_updates_per_run: int = Field(1000, ge=4, le=1900)
    # A ledger with more contexts + calls than this travels through the object store in pages of this
    # size (hand-over, materialization) instead of inline in a payload (~0.5 KB per call; 2 MB limit).
    ledger_page_items: int = Field(1000, ge=1, le=2000)
    # A paged ledger hands over only its live calls: per context its last `branch_window` calls and
    # its head's last `branch_window` ancestors, and calls still generating (workflows/ledger.py
    # `settle`). Older calls are settled: in the pages, still trained, but extending, branching from,
    # discarding or spawning from one is refused (409 SettledCallError). At least 2: a retry extends
    # the head's parent.
    branch_window: int = Field(16, ge=2, le=1000)
    keep_failed_staging: bool = False  # keep a failed episode's staged arrays (debugging)
    policy: PolicyRef | None = None  # the policy its calls need (None: whatever the engine serves)


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


class HarnessOutcome(BaseModel):
    """What the harness produced, in text: the reward function's input."""

    final_answer: str = ""
    outputs: dict[str, list[str]] = Field(default_factory=dict)  # agent -> selected completions' texts
    failure: str | None = None
    failure_kind: FailureKind | None = None  # who is to blame for `failure` (grove/episodes.py)


class HarnessRunInput(BaseModel):
    """The `run_harness` activity's input: the episode it drives (small: ids, task, harness options)."""

    spec: EpisodeSpec


class HarnessRunResult(BaseModel):
    """What one launch of a harness process did (the episode's outcome went to the gateway's close)."""

    launch: int  # 1 for the first launch, n for the (n-1)th relaunch after a lost runner
    exit_code: int | None  # None: killed at its deadline
    wall_s: float
    events: int  # harness events read from its stdout (OpenCode `--format json`)
    failure: str | None = None  # what the close reported, if the launch failed
    already_closed: bool = False  # the episode was closed before this launch (nothing launched)


class HarnessHeartbeat(BaseModel):
    """The runner's heartbeat details (Temporal UI: pending activity): process, calls so far, last request."""

    launch: int
    pid: int | None
    elapsed_s: float
    calls: int  # calls the episode's ledger admitted so far (all agents)
    last_request: str | None  # ISO time (workflow clock) of the episode's last Update
    last_event: str | None  # the harness's last event type (OpenCode: step_start, tool_use, text, ...)


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

    def record(self) -> EpisodeRecord:
        """What the learner needs of this episode (its rows are loaded from rows_key)."""
        return EpisodeRecord(
            episode_id=self.episode_id, group_id=self.group_id, reward=self.reward, status=self.status,
            # a failed result without a kind (recorded before kinds existed) is not blamed on the policy
            failure_kind=(self.failure_kind or "infrastructure") if self.status == "failed" else None,
            failure=self.failure,
            rows_key=self.rows_key, num_rows=self.num_rows,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------ activities


class GenerateInput(BaseModel):
    episode_id: str
    call_id: str
    prompt: PromptSpec
    sampling: SamplingConfig
    policy: PolicyRef | None = None  # the engine follows this run first (activities/follow.py)
    # A completion whose inline form is larger than this many bytes is returned by reference (a
    # `Completion` in the object store). None: always inline (callers before claim-checked completions).
    completion_inline_max: int | None = Field(None, ge=0)


class GenerateResult(_CompletionCarrier):
    """The staged call's receipt and its response: inline when small, else `completion_ref`."""

    call_id: str
    staging_key: str
    digests: TokenDigests
    finish_reason: str
    policy_version: int
    reused_staged: bool = False  # a retry found this call already staged and returned it
    # What the engine sampled with (shapes the behaviour logprobs); the ledger records it in the
    # receipt. None only in results recorded before it existed (replayed histories).
    sampling: SamplingProcessing | None = None
    # How the completion parsed when the request offered tools (None: no tools offered); the
    # ledger records it in the call's receipt.
    tool_call: ToolCallOutcome | None = None
    # A native chat call (prompt `chat` or `chat_delta`): its Conversation, stored for its continuation
    # to name (ChatDelta). None for other prompts, and in results recorded before it existed.
    conversation_ref: ObjectRef | None = None


class LoadCompletionInput(BaseModel):
    """Read a claim-checked completion (the native harness's: its program runs in the workflow)."""

    episode_id: str
    ref: ObjectRef


class RewardInput(BaseModel):
    task: TaskSpec
    outcome: HarnessOutcome
    # An external harness that closed without `outputs`: agent -> the call id of its last selected
    # action (Ledger.last_outputs); the reward activity reads those calls' responses from their chat
    # records (gateway/records.py) into outcome.outputs before scoring.
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
    train_auxiliary: bool = False
    # A large ledger travels as snapshot pages (keys of LedgerPage objects), `contexts` and `receipts`
    # then stay empty: Temporal payloads stay small whatever the episode's length.
    ledger_pages: list[str] = Field(default_factory=list)
    # Set when the pages hold the ledger as it was *before* its close: materialize closes the joined
    # ledger itself (cancel_outstanding=True, this reason), exactly as the workflow did, so the close's
    # settlement of every call is not written through the history once more.
    close_reason: str | None = None
    # A settled episode (workflows/handover.py EpisodeCarry.settled): the pages of its earlier runs are
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


class CleanStagingInput(BaseModel):
    episode_id: str
    keep: bool = False  # keep staged arrays (debugging a failed episode)
    extra_prefixes: list[str] = Field(default_factory=list)  # also deleted (ledger snapshot pages)


class CleanStagingResult(BaseModel):
    deleted: int


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


# ------------------------------------------------------------------------------------------ run


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
    engine starts (activities/engine.py `check_engine_limits`): a context longer than the model's
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
        "the state at ~1 KB per record, under Temporal's 2 MB payload limit however many steps)",
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
        "harnesses (opencode, python) need more than harness.deadline_s x harness.max_launches; left "
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


STEP_RECORDS_ROOT = "runs"


def step_record_key(run_id: str, step: int) -> str:
    """Where a step's StepRecord lives once the run's state no longer carries it (deterministic)."""
    return f"{STEP_RECORDS_ROOT}/{run_id}/steps/step-{step:06d}.json"


class RunState(BaseModel):
    """Everything the run needs to continue: carried whole through continue-as-new. Bounded: `history`
    holds the last `config.carried_history_steps` records; those of steps before `history_from` are in
    the object store (step_record_key)."""

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
    """Step records the run's state stops carrying, written to the store (step_record_key)."""

    run_id: str
    records: list[StepRecord]


EpisodeSpec.model_rebuild()
