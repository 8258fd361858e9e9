"""Token-free records of an episode's contexts and calls, shared by the ledger and the reconstruction.

These are the only facts about a model call that live in Temporal workflow state: ids, links,
lengths, sha256 digests and the staging key where the token arrays are. The arrays themselves
(`CallTokens`) live in the object store's staging area and meet the receipts again only in the
reconstruction (trainer/forest.py), which verifies one against the other.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from grove.sampling import SamplingProcessing


class CallKind(StrEnum):
    """What a call is to the policy: an action of the task, or an auxiliary call of one of three kinds.

    Auxiliary calls settle AUXILIARY (ledger/settlement.py). Of them only a SUMMARY has a consequence
    the reward can see (its text is what its agent knows after the rewrite that follows), so it is the
    one auxiliary kind a run may train (`RunConfig.train_auxiliary`); a TITLE is shown to people, never
    read by an agent, and AUXILIARY is any other helper call: neither is ever trained.
    """

    ACTION = "action"  # a policy action of the task: trainable when selected
    AUXILIARY = "auxiliary"  # another helper call (a classifier, a check): recorded, never trained
    SUMMARY = "summary"  # the summary of its agent's context (a compaction): trained if the run says so
    TITLE = "title"  # a title for the conversation: recorded, never trained

    @property
    def auxiliary(self) -> bool:
        """Not a policy action of the task (settles AUXILIARY)."""
        return self != CallKind.ACTION


AUXILIARY_KINDS: tuple[CallKind, ...] = (CallKind.SUMMARY, CallKind.TITLE, CallKind.AUXILIARY)
TRAINABLE_AUXILIARY_KINDS: frozenset[CallKind] = frozenset({CallKind.SUMMARY})
AUX_SEPARATOR = (
    "~"  # `<agent>~summary`: the context of an agent's auxiliary calls (gateway/pipeline/identity.py)
)


def acting_agent(agent: str) -> str:
    """The agent whose action a call is: `worker-2` for its auxiliary agent `worker-2~summary`."""
    return agent.split(AUX_SEPARATOR, 1)[0]


class CallState(StrEnum):
    """Lifecycle: admitted -> completed -> selected, auxiliary or discarded; or admitted -> failed, cancelled
    or discarded (a lost attempt). Each call ends in exactly one terminal state."""

    ADMITTED = "admitted"
    COMPLETED = "completed"
    SELECTED = "selected"
    DISCARDED = "discarded"
    AUXILIARY = "auxiliary"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL_STATES: frozenset[CallState] = frozenset(
    {CallState.SELECTED, CallState.DISCARDED, CallState.AUXILIARY, CallState.CANCELLED, CallState.FAILED}
)


class ToolCallOutcome(StrEnum):
    """What a completion offered tools came out as (its request listed tools; else no outcome)."""

    WELL_FORMED = "well_formed"  # parsed as one or more well-formed tool calls
    MALFORMED = "malformed"  # tried to call a tool but did not parse (kept as plain content)
    NONE = "none"  # plain content: no tool call attempted


class ContextOrigin(StrEnum):
    """How a context was opened."""

    ROOT = "root"  # the first context of an agent that nobody spawned (the episode's parent)
    SPAWN = "spawn"  # a worker's context, spawned by a named call of another agent
    REWRITE = "rewrite"  # a declared rewrite (compaction) of the same agent's previous context


class ContextRecord(BaseModel):
    """One context reservation: an agent's token stream from its start (or rewrite) on."""

    model_config = ConfigDict(frozen=True)

    context_id: str
    agent: str
    origin: ContextOrigin
    spawned_by_call: str | None = None  # SPAWN: the call whose response spawned this worker
    rewrite_of: str | None = None  # REWRITE: the context this one replaces


class TokenDigests(BaseModel):
    """Lengths and sha256 digests of a call's staged arrays (little-endian int32 ids, float32 logprobs)."""

    model_config = ConfigDict(frozen=True)

    prompt_len: int = Field(ge=0)
    completion_len: int = Field(ge=0)
    prompt_sha256: str
    completion_sha256: str
    logprobs_sha256: str


class CallReceipt(BaseModel):
    """Everything the workflow keeps about one call; token arrays are at `staging_key`.

    `parent_call_id` is the claimed continuation link (None for a context's root or a branch root);
    the reconstruction verifies it on tokens: prompt starts with parent.prompt + parent.completion.
    `sampling` is the processing the generate activity actually sampled with (temperature, top_p):
    the learner scores this call's tokens under it (None until completed; a member without it is
    refused by the reconstruction).
    """

    call_id: str
    context_id: str
    agent: str
    kind: CallKind = CallKind.ACTION
    parent_call_id: str | None = None
    state: CallState = CallState.ADMITTED
    staging_key: str | None = None
    digests: TokenDigests | None = None
    policy_version: int | None = None
    finish_reason: str | None = None
    sampling: SamplingProcessing | None = None
    note: str | None = None  # why a call ended discarded / cancelled / failed (shown in the UI)
    # how the completion parsed when its request offered tools (None: no tools offered, or a
    # receipt recorded before outcomes were): the run's tool-call validity metrics count these
    tool_call: ToolCallOutcome | None = None
