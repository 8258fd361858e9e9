"""Claim checks: a chat request's messages go to the object store, the Temporal Update carries a reference.

A chat request can be megabytes (a long agent history, a pasted file). Inline in the `call` Update and
again in the `generate` activity's input it would grow the episode's history by twice its size per
call, until Temporal terminates the workflow. `stash_prompt` writes the request's ChatPrompt
(messages, tools, parent messages) as JSON under the call's staging folder — deleted with the staged
arrays when the episode ends — and replaces it by an `ObjectRef` (key, sha256, size); the generate
activity loads it and verifies the digest (capture/prompt.py `resolve_chat_ref`).

Keys are deterministic per (episode, call, content), written with put_if_absent: a retried request
finds its own bytes.

The same in the other direction: a completion larger than COMPLETION_INLINE_MAX (its ids, text and chat
message) would land twice in the history (the generate activity's result and the `call` Update's) and,
big enough, fail the Update with a payload-size error. The generate activity stores its `Completion`
(`stash_completion`) beside the call's staged arrays and returns an `ObjectRef`; whoever answers the
harness (the gateway, the native harness through the `load_completion` IO activity) reads it back with
`load_completion`, which verifies size and sha256. A missing or different object is a typed storage
error: `CompletionMissingError` (an ObjectNotFoundError) or `CompletionDigestError` (a
DigestMismatchError), handled like every other store read of its kind (HTTP 503 at the gateway, whose
client's retry regenerates the call; a non-retryable, named failure in an IO activity).
"""

from __future__ import annotations

from dataclasses import dataclass

from grove.contracts import CallRequest, CallResult, Completion, Conversation, GenerateResult, ObjectRef
from grove.store_layout import chat_prompt_key, completion_key, conversation_key, staging_prefix
from storage.base import DigestMismatchError, ObjectNotFoundError, ObjectStore, StorageError, sha256_hex


def stash_prompt(store: ObjectStore, episode_id: str, call: CallRequest) -> CallRequest:
    """`call` with its chat prompt moved to the store (unchanged if it has none)."""
    chat = call.prompt.chat
    if chat is None:
        return call
    data = chat.model_dump_json().encode()
    sha = sha256_hex(data)
    key = chat_prompt_key(episode_id, call.call_id, sha)
    store.put_if_absent(key, data)
    ref = ObjectRef(key=key, sha256=sha, size=len(data))
    return call.model_copy(update={"prompt": call.prompt.model_copy(update={"chat": None, "chat_ref": ref})})


def stash_conversation(
    store: ObjectStore, episode_id: str, call_id: str, conversation: Conversation
) -> ObjectRef:
    """Store a native chat call's Conversation for its continuation's `ChatDelta` (deterministic key and
    bytes: a re-run verifies its own); read back by capture/prompt.py `resolve_chat_delta`."""
    data = conversation.model_dump_json().encode()
    sha = sha256_hex(data)
    key = conversation_key(episode_id, call_id, sha)
    store.put_if_absent(key, data)
    return ObjectRef(key=key, sha256=sha, size=len(data))


# ---- reading a claim back ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimErrors:
    """How one kind of claim fails to read: the error each fault raises, and what the caller should do.
    (A missing completion is a storage error a retry mends; a missing chat prompt is bad call input.)"""

    outside: type[Exception]
    missing: type[Exception]
    changed: type[Exception]
    missing_hint: str
    changed_hint: str


def read_claim(store: ObjectStore, episode_id: str, ref: ObjectRef, what: str, errors: ClaimErrors) -> bytes:
    """The bytes `ref` names, verified: inside the episode's staging (another episode's object is never
    read), in the store, of the size and sha256 the reference names."""
    prefix = staging_prefix(episode_id)
    if not ref.key.startswith(prefix):
        raise errors.outside(f"{what} is outside episode {episode_id!r}'s staging {prefix!r}")
    try:
        data = store.get(ref.key)
    except ObjectNotFoundError:
        raise errors.missing(
            f"{what} of episode {episode_id!r} is not in the store ({errors.missing_hint})"
        ) from None
    if len(data) != ref.size or sha256_hex(data) != ref.sha256:
        raise errors.changed(
            f"{what} of episode {episode_id!r} holds {len(data)} B with sha256 {sha256_hex(data)[:16]}..., "
            f"not the {ref.size} B / {ref.sha256[:16]}... its reference names: {errors.changed_hint}"
        )
    return data


# ---- completions ---------------------------------------------------------------------------------


class CompletionClaimError(StorageError):
    """A claim-checked completion that cannot be read as its reference names it."""


class CompletionMissingError(CompletionClaimError, ObjectNotFoundError):
    """The completion's object is not in the store (deleted with the episode's staging, or lost)."""


class CompletionDigestError(CompletionClaimError, DigestMismatchError):
    """The object under the completion's key is not the bytes its reference names, or the reference
    points outside the episode's staging."""


_COMPLETION_ERRORS = ClaimErrors(
    outside=CompletionDigestError,
    missing=CompletionMissingError,
    changed=CompletionDigestError,
    missing_hint="the generate activity wrote it before returning; the episode's staging is deleted when it "
    "ends: retry the request, which generates the call again",
    changed_hint="the stored completion was changed; retry the request",
)


def inline_size(completion_ids: list[int], completion: Completion) -> int:
    """Bytes the completion adds to a payload when inline (its ids, text and message as JSON)."""
    ids = len(",".join(map(str, completion_ids))) + 2
    return ids + len(completion.model_dump_json().encode())


def by_reference(completion_ids: list[int], completion: Completion, inline_max: int | None) -> bool:
    """Whether a completion travels by reference: its inline form is over `inline_max` (None: never)."""
    return inline_max is not None and inline_size(completion_ids, completion) > inline_max


def stash_completion(store: ObjectStore, episode_id: str, call_id: str, completion: Completion) -> ObjectRef:
    """Store `completion` under a deterministic key (idempotent: a re-run verifies its own bytes)."""
    data = completion.model_dump_json().encode()
    sha = sha256_hex(data)
    key = completion_key(episode_id, call_id, sha)
    store.put_if_absent(key, data)
    return ObjectRef(key=key, sha256=sha, size=len(data))


def load_completion(store: ObjectStore, episode_id: str, ref: ObjectRef) -> Completion:
    """The completion `ref` names, verified (size, sha256, inside the episode's staging)."""
    data = read_claim(store, episode_id, ref, f"completion {ref.key!r}", _COMPLETION_ERRORS)
    return Completion.model_validate_json(data)


def completion_of(store: ObjectStore, episode_id: str, result: CallResult | GenerateResult) -> Completion:
    """The completion of a CallResult or GenerateResult: inline, or read from the store."""
    inline = result.inline_completion()
    if inline is not None:
        return inline
    if result.completion_ref is None:  # the carrier's validator refuses a result with neither
        raise CompletionClaimError(f"call {result.call_id!r}: no completion inline and no completion_ref")
    return load_completion(store, episode_id, result.completion_ref)
