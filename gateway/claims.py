"""Claim checks: a chat request's messages go to the object store, the Temporal Update carries a reference.

A chat request can be megabytes (a long agent history, a pasted file). Inline in the `call` Update and
again in the `generate` activity's input it would grow the episode's history by twice its size per
call, until Temporal terminates the workflow (issue 12). `stash_prompt` writes the request's ChatPrompt
(messages, tools, parent messages) as JSON under the call's staging folder — deleted with the staged
arrays when the episode ends — and replaces it by an `ObjectRef` (key, sha256, size); the generate
activity loads it and verifies the digest (gateway/prompt.py `resolve_chat_ref`).

Keys are deterministic per (episode, call, content), written with put_if_absent: a retried request
finds its own bytes.
"""

from __future__ import annotations

from grove.contracts import CallRequest, ObjectRef
from storage.base import ObjectStore, sha256_hex
from trainer.staging_format import staging_prefix


def request_key(episode_id: str, call_id: str, sha256: str) -> str:
    return f"{staging_prefix(episode_id)}requests/{call_id}-{sha256[:16]}.json"


def stash_prompt(store: ObjectStore, episode_id: str, call: CallRequest) -> CallRequest:
    """`call` with its chat prompt moved to the store (unchanged if it has none)."""
    chat = call.prompt.chat
    if chat is None:
        return call
    data = chat.model_dump_json().encode()
    sha = sha256_hex(data)
    key = request_key(episode_id, call.call_id, sha)
    store.put_if_absent(key, data)
    ref = ObjectRef(key=key, sha256=sha, size=len(data))
    return call.model_copy(update={"prompt": call.prompt.model_copy(update={"chat": None, "chat_ref": ref})})
