"""A native chat continuation as a delta (grove/contracts/generation.py `ChatDelta`): the parent call's
Conversation is in the store (the generate activity wrote it, capture/claims.py `stash_conversation`), the
call sends only its new messages, and capture/prompt.py joins them into the ChatPrompt the native harness
would otherwise send whole. Pure parts on a real LocalStore and the tiny model's real tokenizer; the path
through Temporal and vLLM is tests/episodes/test_claim_check.py."""

from __future__ import annotations

import numpy as np
import pytest

from capture.claims import stash_conversation
from capture.prompt import ClaimCheckError, PromptSpecError, build_prompt, resolve_chat_ref
from chat.render import render_chat
from grove.contracts import ChatDelta, ChatPrompt, Conversation, PromptSpec
from grove.staging_format import CallTokens, encode_call_tokens
from grove.store_layout import staging_key
from storage.local import LocalStore

EPISODE = "run/s000001/t0/g0"
PARENT = "parent.0.c0"
PARENT_MESSAGES = [
    {"role": "system", "content": "You are the lead."},
    {"role": "user", "content": "Read this file:\n" + "lorem ipsum dolor " * 3_000},  # ~54 KB
]
RESPONSE = {"role": "assistant", "content": "It repeats three words."}
NEW = [{"role": "user", "content": "Go on."}]


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path)


def _stash_parent(store: LocalStore, tokenizer) -> Conversation:
    """The parent call as the generate activity leaves it: staged arrays and its Conversation."""
    prompt = render_chat(tokenizer, PARENT_MESSAGES, None, None).prompt_ids
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    completion = tokenizer.encode(RESPONSE["content"], add_special_tokens=False) + [stop]
    tokens = CallTokens.of(
        np.asarray(prompt, np.int32), np.asarray(completion, np.int32), np.zeros(len(completion), np.float32)
    )
    store.put(staging_key(EPISODE, PARENT), encode_call_tokens(tokens))
    return Conversation(messages=PARENT_MESSAGES, response=RESPONSE)


def _delta(store: LocalStore, conversation: Conversation, call_id: str = PARENT) -> PromptSpec:
    ref = stash_conversation(store, EPISODE, call_id, conversation)
    return PromptSpec(
        chat_delta=ChatDelta(parent_conversation=ref, messages=NEW),
        parent_call_id=PARENT,
        parent_staging_key=staging_key(EPISODE, PARENT),
    )


def test_a_delta_builds_the_prompt_of_the_whole_conversation_from_a_fraction_of_its_bytes(
    store, tiny_tokenizer
):
    conversation = _stash_parent(store, tiny_tokenizer)
    delta = _delta(store, conversation)
    whole = PromptSpec(
        chat=ChatPrompt(messages=[*PARENT_MESSAGES, RESPONSE, *NEW], parent_messages=PARENT_MESSAGES),
        parent_call_id=PARENT,
        parent_staging_key=staging_key(EPISODE, PARENT),
    )
    stop = frozenset({tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")})
    joined = build_prompt(delta, EPISODE, store, tiny_tokenizer, stop)
    np.testing.assert_array_equal(joined, build_prompt(whole, EPISODE, store, tiny_tokenizer, stop))
    assert resolve_chat_ref(delta, EPISODE, store).chat == whole.chat
    # what crosses Temporal: the new message and a reference, not the ~54 KB conversation (twice)
    assert len(delta.model_dump_json()) < 1_000 < 100_000 < len(whole.model_dump_json())


def test_a_delta_names_only_its_own_parents_conversation_unchanged(store, tiny_tokenizer):
    conversation = _stash_parent(store, tiny_tokenizer)
    other = _delta(store, conversation, call_id="worker-1.0.c0")  # another call's conversation
    with pytest.raises(ClaimCheckError, match="not one of parent call 'parent.0.c0'"):
        resolve_chat_ref(other, EPISODE, store)
    delta = _delta(store, conversation)
    store.put(delta.chat_delta.parent_conversation.key, b"{}")
    with pytest.raises(ClaimCheckError, match="was changed"):
        resolve_chat_ref(delta, EPISODE, store)
    store.delete(delta.chat_delta.parent_conversation.key)
    with pytest.raises(ClaimCheckError, match="not in the store.*parent's generate activity"):
        resolve_chat_ref(delta, EPISODE, store)


def test_a_delta_needs_its_parent_and_no_other_prompt(store, tiny_tokenizer):
    delta = _delta(store, _stash_parent(store, tiny_tokenizer))
    with pytest.raises(PromptSpecError, match="chat_delta continues a parent call"):
        resolve_chat_ref(delta.model_copy(update={"parent_call_id": None}), EPISODE, store)
    both = delta.model_copy(update={"chat": ChatPrompt(messages=NEW)})
    with pytest.raises(ClaimCheckError, match="both chat and chat_delta"):
        resolve_chat_ref(both, EPISODE, store)
