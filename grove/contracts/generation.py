"""Contracts of the generation boundary: how a call's prompt is named (tokens, a chat prompt, a claim check
or a native delta), the policy that must serve it, and the `generate` activity's input and result.

Token arrays never appear here except a small completion's ids (inline below COMPLETION_INLINE_MAX bytes,
else the completion travels as a reference: `Completion`) and a new observation suffix; prompts travel
as references to staged arrays.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grove.receipts import TokenDigests, ToolCallOutcome
from grove.sampling import SamplingConfig, SamplingProcessing


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
    message its caller got. The generate activity stores it (capture/claims.py `stash_conversation`)
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
    (docs/design.md, "8. Durability"). The gateway stores it (capture/claims.py); the activity loads and
    verifies it. The native harness, which cannot write the store (it is workflow code), sends a
    continuation as `chat_delta` (its new messages and the parent's stored `Conversation`), its roots as
    `chat`.
    """

    ids: list[int] | None = None  # a context root given as tokens
    suffix_ids: list[int] | None = None  # parent prompt + parent completion + these (a continuation)
    chat: ChatPrompt | None = None  # rendered with the model's chat template
    chat_ref: ObjectRef | None = None  # the same, claim-checked: a ChatPrompt JSON in the object store
    chat_delta: ChatDelta | None = None  # the same, as new messages after a stored parent Conversation
    parent_call_id: str | None = None
    parent_staging_key: str | None = None


# Completions whose inline form (ids + text + chat message, JSON) is larger than this many bytes travel
# as a claim check (`completion_ref`): the generate activity stores the `Completion` and its result, the
# `call` Update's result and the history carry a reference of a couple of hundred bytes. Below it, storing
# would cost a write and a read per call to save less history than the reference adds back (measured:
# docs/results.md section 3.9; the default max_tokens 256 stays inline).
COMPLETION_INLINE_MAX = 4096


class Completion(BaseModel):
    """A call's response as its caller sees it: the completion decoded, and parsed as a chat message.
    The token ids are the staged arrays' (`staging_key`); this is what a claim check stores."""

    text: str
    assistant_message: dict[str, Any]


class _CompletionCarrier(BaseModel):
    """A completion inline (`completion_ids`, `text`, `assistant_message`) or by reference
    (`completion_ref`: a `Completion` JSON in the object store, read with capture/claims.py)."""

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
