"""Chat records: what the gateway needs to decide the next request of a context, kept in the object store.

The gateway keeps no state of its own. After each call, and *before* the HTTP response leaves, it
writes the call's chat record (request messages, tools, the response message it returns, usage)
beside the call's staged arrays, at a deterministic key, with put_if_absent. A completed call without
a record, whose request no longer runs in this gateway, is a response that was never delivered (the
gateway died in between): the next request of that context discards it (gateway/pipeline/planning.py).

Whether the harness got a response whole is not a record here: the ledger decides it (the `deliver`
Update, ledger/delivery.py). Records are deleted with the episode's staging area when it closes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from grove.receipts import CallKind
from grove.store_layout import chat_record_key
from storage.base import ObjectNotFoundError, ObjectStore


class CorruptChatRecordError(ValueError):
    """An object at a chat-record key that is not a chat record of that call."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ChatRecord(BaseModel):
    """One call as the harness saw it."""

    episode_id: str
    call_id: str
    context_id: str
    agent: str
    kind: CallKind
    extends: str | None  # the call this one continues (None: the context's root)
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    response: dict[str, Any]  # the assistant message returned (tool-call ids included)
    finish_reason: str
    usage: Usage
    policy_version: int
    session_id: str | None = None  # the harness's session (OpenCode)
    launch: int | None = None  # which launch of a runner-launched harness made it (x-grove-launch)


def encode_record(record: ChatRecord) -> bytes:
    """Deterministic bytes (a retried write of the same record verifies instead of failing)."""
    return json.dumps(record.model_dump(mode="json"), sort_keys=True, ensure_ascii=False).encode()


def save_record(store: ObjectStore, record: ChatRecord) -> None:
    store.put_if_absent(chat_record_key(record.episode_id, record.call_id), encode_record(record))


def load_record(store: ObjectStore, episode_id: str, call_id: str) -> ChatRecord | None:
    """The call's record, None if there is none; CorruptChatRecordError for a foreign object."""
    key = chat_record_key(episode_id, call_id)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    try:
        record = ChatRecord.model_validate_json(data)
    except ValueError as err:
        raise CorruptChatRecordError(f"object {key!r} is not a chat record: {err}") from None
    if (record.episode_id, record.call_id) != (episode_id, call_id):
        raise CorruptChatRecordError(
            f"object {key!r} holds the record of call {record.call_id!r} of episode {record.episode_id!r}, "
            f"not of call {call_id!r} of {episode_id!r}; inspect and delete it"
        )
    return record
