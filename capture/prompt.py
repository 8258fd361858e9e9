"""A call's exact prompt ids from its PromptSpec: the one assembly the generate activity samples from and the
gateway's context window measures, so both count the same tokens.

A PromptSpec is exactly one of: ids (a context root), a parent + suffix_ids (`prompt = parent prompt +
parent completion + suffix`, read from the parent's staged arrays), or a chat prompt rendered with the
model's chat template (chat/render.py), splicing a parent's exact tokens when it names one. A chat
prompt may be claim-checked (`chat_ref`): the gateway wrote it to the episode's staging
(capture/claims.py) and the call names its size and sha256; it is loaded and verified here. A native
continuation may be a `chat_delta`: its new messages after the parent call's stored `Conversation`
(written by the parent's generate activity), joined here into the ChatPrompt it stands for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from capture.claims import ClaimErrors, read_claim
from chat.render import Predecessor, render_chat
from chat.tool_parsers import ToolCallParser
from grove.contracts import ChatPrompt, Conversation, PromptSpec
from grove.staging_format import CallTokens, decode_call_tokens
from grove.store_layout import conversation_prefix, staging_key
from storage.base import ObjectNotFoundError, ObjectStore


class PromptSpecError(ValueError):
    """A PromptSpec that is not exactly one of: ids, parent + suffix_ids, chat (optionally with a parent)."""


class ClaimCheckError(PromptSpecError):
    """A claim-checked chat prompt (`chat_ref`): missing, foreign, or not the bytes its digest names."""


class ParentNotStagedError(LookupError):
    """A continuation names a parent whose staged arrays are not in the store."""


def check_prompt_spec(spec: PromptSpec, episode_id: str) -> None:
    """Fail unless `spec` names exactly one way to build the prompt, with the parent it needs."""
    ways = [
        w
        for w, v in (("ids", spec.ids), ("suffix_ids", spec.suffix_ids), ("chat", spec.chat))
        if v is not None
    ]
    if len(ways) != 1:
        raise PromptSpecError(
            f"a prompt spec needs exactly one of ids, suffix_ids, chat; got {ways or 'none'}"
        )
    has_parent = spec.parent_call_id is not None or spec.parent_staging_key is not None
    if ways == ["ids"] and has_parent:
        raise PromptSpecError("a prompt given as ids is a context root; it cannot name a parent call")
    if ways == ["suffix_ids"] and not has_parent:
        raise PromptSpecError("suffix_ids continue a parent call: set parent_call_id and parent_staging_key")
    if ways == ["chat"] and has_parent and spec.chat is not None and spec.chat.parent_messages is None:
        raise PromptSpecError(
            "a chat continuation needs parent_messages (the messages the parent was rendered from)"
        )
    if has_parent:
        if spec.parent_call_id is None or spec.parent_staging_key is None:
            raise PromptSpecError("a continuation needs both parent_call_id and parent_staging_key")
        expected = staging_key(episode_id, spec.parent_call_id)
        if spec.parent_staging_key != expected:
            raise PromptSpecError(
                f"parent {spec.parent_call_id!r} of episode {episode_id!r} is staged at {expected!r}, "
                f"not {spec.parent_staging_key!r}"
            )


def load_staged(store: ObjectStore, key: str, what: str) -> CallTokens:
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        raise ParentNotStagedError(
            f"{what}: no staged arrays at {key!r}; the parent call must complete (and be staged) first"
        ) from None
    return decode_call_tokens(data, key=key)


_CHAT_REF_ERRORS = ClaimErrors(
    outside=ClaimCheckError,
    missing=ClaimCheckError,
    changed=ClaimCheckError,
    missing_hint="the gateway writes it before the call Update: re-send the request",
    changed_hint="the stored request was changed",
)


_CONVERSATION_ERRORS = ClaimErrors(
    outside=ClaimCheckError,
    missing=ClaimCheckError,
    changed=ClaimCheckError,
    missing_hint="the parent's generate activity writes it before it returns; the episode's staging is "
    "deleted when the episode ends",
    changed_hint="the stored conversation was changed",
)


def resolve_chat_ref(spec: PromptSpec, episode_id: str, store: ObjectStore) -> PromptSpec:
    """`spec` with its claim-checked chat prompt loaded from the store and verified (capture/claims.py),
    or its chat delta joined to the parent's stored conversation (`resolve_chat_delta`)."""
    ref = spec.chat_ref
    if ref is None:
        return resolve_chat_delta(spec, episode_id, store)
    if spec.chat is not None or spec.chat_delta is not None:
        raise ClaimCheckError("a prompt spec has chat_ref and also chat or chat_delta; send one")
    data = read_claim(store, episode_id, ref, f"chat_ref {ref.key!r}", _CHAT_REF_ERRORS)
    return spec.model_copy(update={"chat": ChatPrompt.model_validate_json(data), "chat_ref": None})


def resolve_chat_delta(spec: PromptSpec, episode_id: str, store: ObjectStore) -> PromptSpec:
    """`spec` with its chat delta joined to its parent's stored Conversation: the ChatPrompt
    `parent.messages + [parent.response] + delta.messages` (parent messages, tools: the parent's)."""
    delta = spec.chat_delta
    if delta is None:
        return spec
    if spec.chat is not None:
        raise ClaimCheckError("a prompt spec has both chat and chat_delta; send one")
    if spec.parent_call_id is None or spec.parent_staging_key is None:
        raise PromptSpecError(
            "a chat_delta continues a parent call: set parent_call_id and parent_staging_key"
        )
    ref = delta.parent_conversation
    what = f"chat_delta's parent_conversation {ref.key!r}"
    own = conversation_prefix(episode_id, spec.parent_call_id)
    if not ref.key.startswith(own):  # the parent's own conversation, not another call's
        raise ClaimCheckError(f"{what} is not one of parent call {spec.parent_call_id!r}'s ({own!r}...)")
    parent = Conversation.model_validate_json(read_claim(store, episode_id, ref, what, _CONVERSATION_ERRORS))
    chat = ChatPrompt(
        messages=[*parent.messages, parent.response, *delta.messages],
        tools=parent.tools,
        parent_messages=parent.messages,
    )
    return spec.model_copy(update={"chat": chat, "chat_delta": None})


def build_prompt(
    spec: PromptSpec,
    episode_id: str,
    store: ObjectStore,
    tokenizer: Any,
    stop_ids: frozenset[int],
    tool_parser: ToolCallParser | None = None,
) -> np.ndarray:
    """The call's prompt ids (int32), exactly; reads the parent's staged arrays for a continuation."""
    spec = resolve_chat_ref(spec, episode_id, store)
    check_prompt_spec(spec, episode_id)
    if spec.ids is not None:
        return np.asarray(spec.ids, dtype=np.int32)
    parent = None
    if spec.parent_staging_key is not None:
        parent = load_staged(store, spec.parent_staging_key, f"parent call {spec.parent_call_id}")
    # check_prompt_spec has refused a spec that the three checks below find incomplete
    if spec.suffix_ids is not None:
        if parent is None:
            raise PromptSpecError("suffix_ids continue a parent call: set parent_staging_key")
        suffix = np.asarray(spec.suffix_ids, dtype=np.int32)
        return np.concatenate([parent.prompt_ids, parent.completion_ids, suffix]).astype(np.int32)
    chat = spec.chat
    if chat is None:
        raise PromptSpecError("a prompt spec needs exactly one of ids, suffix_ids, chat; got none")
    predecessor = None
    if parent is not None:
        if chat.parent_messages is None:
            raise PromptSpecError("a chat continuation needs parent_messages")
        predecessor = Predecessor(
            messages=chat.parent_messages,
            prompt_ids=parent.prompt_ids.tolist(),
            completion_ids=parent.completion_ids.tolist(),
            tools=chat.tools,  # the contract carries one tool list: the parent's is the same
            # the message the gateway returned for the parent; without it, derived by `tool_parser`
            response=chat.parent_response,
        )
    rendered = render_chat(
        tokenizer, chat.messages, chat.tools, predecessor, stop_ids=sorted(stop_ids), tool_parser=tool_parser
    )
    return np.asarray(rendered.prompt_ids, dtype=np.int32)
