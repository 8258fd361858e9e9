"""The call archive: what an episode's calls were, kept after its staging area is cleaned, for viewers.

Staging (token arrays, chat records) is deleted when an episode closes, and the rows hold only the
calls the harness used. Materialize, which has the closed ledger and the staged arrays in hand, writes
one more object: `calls/{episode}.json`, every context and every call of the episode (any state), each
with

- its receipt (state, links, kind, sampling processing, policy version, note);
- its completion ids and behaviour log-probabilities (completed calls whose arrays were staged);
- the last `PROMPT_TAIL` prompt ids and the prompt's length;
- from its chat record, when the gateway wrote one: the request's last `MESSAGES_TAIL` messages, the
  response message, the harness's session and launch.

Its size is linear in the episode's completion tokens (never the quadratic sum of prompts).
`grove episode view` reads it (cli/episode_view_data.py); nothing trains from it. A missing staged
object (a lost attempt, a failed episode cleaned) leaves that call's arrays out, never the call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel

from grove.receipts import CallReceipt, ContextRecord
from grove.staging_format import CallTokens, decode_call_tokens
from grove.store_layout import call_archive_key
from storage.base import ObjectNotFoundError, ObjectStore

PROMPT_TAIL = 96  # prompt tokens kept per call: what the call was answering
MESSAGES_TAIL = 2  # request messages kept per call (the chat record's last ones)


class ArchivedCall(BaseModel):
    receipt: CallReceipt
    prompt_len: int | None = None
    prompt_tail_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    messages_tail: list[dict[str, Any]] | None = None
    response: dict[str, Any] | None = None
    session_id: str | None = None
    launch: int | None = None


class CallArchive(BaseModel):
    episode_id: str
    group_id: str
    contexts: list[ContextRecord]
    calls: list[ArchivedCall]


def archived_call(receipt: CallReceipt, tokens: CallTokens | None, record: Any | None) -> ArchivedCall:
    """One call's entry from its receipt, staged arrays (or None) and chat record (or None)."""
    call = ArchivedCall(receipt=receipt)
    if tokens is not None:
        call.prompt_len = int(tokens.prompt_ids.size)
        call.prompt_tail_ids = tokens.prompt_ids[-PROMPT_TAIL:].tolist()
        call.completion_ids = tokens.completion_ids.tolist()
        call.logprobs = [round(float(x), 5) for x in tokens.logprobs]
    if record is not None:
        call.messages_tail = record.messages[-MESSAGES_TAIL:]
        call.response = record.response
        call.session_id = record.session_id
        call.launch = record.launch
    return call


def build_archive(
    episode_id: str,
    group_id: str,
    contexts: Iterable[ContextRecord],
    receipts: Iterable[CallReceipt],
    tokens_of: Callable[[CallReceipt], CallTokens | None],
    record_of: Callable[[CallReceipt], Any | None],
) -> CallArchive:
    """The archive of these contexts and calls, in call-id order (stable whatever the arrival order)."""
    calls = [archived_call(r, tokens_of(r), record_of(r)) for r in sorted(receipts, key=lambda r: r.call_id)]
    ordered = sorted(contexts, key=lambda c: c.context_id)
    return CallArchive(episode_id=episode_id, group_id=group_id, contexts=ordered, calls=calls)


def encode_archive(archive: CallArchive) -> bytes:
    """Deterministic bytes: a retried materialize finds the same object and verifies it."""
    return json.dumps(archive.model_dump(mode="json"), sort_keys=True, ensure_ascii=False).encode()


def staged_tokens(
    store: ObjectStore, known: dict[str, CallTokens]
) -> Callable[[CallReceipt], CallTokens | None]:
    """A receipt's staged arrays: from `known` (already read), else the store, else None."""

    def tokens_of(receipt: CallReceipt) -> CallTokens | None:
        if receipt.call_id in known:
            return known[receipt.call_id]
        if receipt.staging_key is None:
            return None
        try:
            return decode_call_tokens(store.get(receipt.staging_key), key=receipt.staging_key)
        except (ObjectNotFoundError, ValueError):  # lost or foreign: the call stays, without arrays
            return None

    return tokens_of


def save_archive(
    store: ObjectStore,
    episode_id: str,
    group_id: str,
    contexts: Iterable[ContextRecord],
    receipts: Iterable[CallReceipt],
    known_tokens: dict[str, CallTokens],
) -> str:
    """Write the episode's archive (put_if_absent) and return its key."""
    from capture.records import CorruptChatRecordError, load_record

    def record_of(receipt: CallReceipt):
        try:
            return load_record(store, episode_id, receipt.call_id)
        except CorruptChatRecordError:
            return None

    archive = build_archive(
        episode_id, group_id, contexts, receipts, staged_tokens(store, known_tokens), record_of
    )
    key = call_archive_key(episode_id)
    store.put_if_absent(key, encode_archive(archive))
    return key


def load_archive(store: ObjectStore, episode_id: str) -> CallArchive | None:
    """The episode's archive, None when there is none (an episode materialized before archives)."""
    try:
        return CallArchive.model_validate_json(store.get(call_archive_key(episode_id)))
    except ObjectNotFoundError:
        return None
