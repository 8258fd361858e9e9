"""How a chat request relates to its context's head: retry it, continue it, rewrite, or refuse.

Given the request's messages and tools, the chat record of the context's head (capture/records.py)
and the identity's rewrite mode, in this order:

1. no head (a new context, or every earlier call was discarded)  -> ROOT;
2. the head's own prompt messages and tools again: the harness retried or resampled (the OpenAI
   client re-sends a request after a timeout, headers included)  -> RETRY (discard the head, extend
                                                                    what the head extended);
   checked before anything else and in every rewrite mode (docs/design.md section 4): a re-sent
   `x-grove-rewrite` request, or OpenCode's post-compaction request sent twice, lands in the context
   the first send opened (the agent's current context now), whose head is the first send's call;
   discarding it and admitting the retry as that context's root keeps exactly one rewrite;
3. a rewrite the harness declared (x-grove-rewrite)              -> REWRITE (new context, a root);
4. messages == head's messages + head's response + only new user/tool/system messages, compared
   semantically and type-strictly (chat/render.check_extension) -> CONTINUE (extends the head);
5. the head's response was empty (the model ended its turn at once: EOS only) and the request is the
   head's messages + only new user/tool/system messages, without that empty assistant turn: harnesses leave
   an empty reply out of the history they send next (OpenCode does)  -> SKIP_EMPTY (discard the head:
                                                                    accounted, never trained; extend
                                                                    what the head extended, whose
                                                                    messages + response + the head's
                                                                    new messages start this request);
6. an adapter recognised a rewrite (OpenCode's post-compaction request, an auxiliary context)
                                                                 -> REWRITE;
7. otherwise chat.render.UndeclaredDiscontinuityError naming the first differing message index and
   field; nothing is admitted.

Pure module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from capture.records import ChatRecord
from chat.render import (
    NEW_MESSAGE_ROLES,
    Predecessor,
    UndeclaredDiscontinuityError,
    check_extension,
    same_message,
    same_tools,
)
from gateway.pipeline.identity import RewriteMode

__all__ = [
    "Decision",
    "HeadlessMoveError",
    "Move",
    "UndeclaredDiscontinuityError",
    "decide",
    "is_empty_response",
    "omits_empty_response",
    "same_prompt",
]


class Move(StrEnum):
    ROOT = "root"
    CONTINUE = "continue"
    RETRY = "retry"
    REWRITE = "rewrite"
    SKIP_EMPTY = "skip_empty"  # the harness left the head's empty response out: discard it, extend its parent


class HeadlessMoveError(RuntimeError):
    """A move other than ROOT decided without the head record it acts on (a bug in the decision)."""


@dataclass(frozen=True)
class Decision:
    move: Move
    head: ChatRecord | None  # the context's head record (None for ROOT)

    def acted_on(self) -> ChatRecord:
        """The head record a CONTINUE, RETRY, REWRITE or SKIP_EMPTY move acts on."""
        if self.head is None:
            raise HeadlessMoveError(f"a {self.move.value} decision names no head record to act on")
        return self.head


def same_prompt(messages: Sequence[dict[str, Any]], tools: Any, record: ChatRecord) -> bool:
    """Whether the request repeats `record`'s prompt (messages and tools), compared semantically."""
    return (
        len(messages) == len(record.messages)
        and all(same_message(a, b) for a, b in zip(messages, record.messages, strict=True))
        and same_tools(tools, record.tools)
    )


def is_empty_response(response: dict[str, Any]) -> bool:
    """An assistant message with no text (or only whitespace) and no tool calls: an EOS-only reply."""
    content = response.get("content")
    text = content if isinstance(content, str) else "" if content is None else None
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return text is not None and not text.strip() and not response.get("tool_calls")


def omits_empty_response(messages: Sequence[dict[str, Any]], tools: Any, head: ChatRecord) -> bool:
    """The request is `head.messages` + only new user/tool/system messages, and the head's response (left out)
    was empty: the harness dropped an empty reply from its history (rule 5)."""
    k = len(head.messages)
    return (
        is_empty_response(head.response)
        and len(messages) > k
        and same_tools(tools, head.tools)
        and all(same_message(a, b) for a, b in zip(messages[:k], head.messages, strict=True))
        and all(m.get("role") in NEW_MESSAGE_ROLES for m in messages[k:])
    )


def decide(
    messages: Sequence[dict[str, Any]], tools: Any, head: ChatRecord | None, rewrite: RewriteMode
) -> Decision:
    """The move for this request (see the module docstring); raises UndeclaredDiscontinuityError."""
    if head is None:
        return Decision(Move.ROOT, None)
    if same_prompt(messages, tools, head):  # a retry before anything else, whatever the rewrite mode
        return Decision(Move.RETRY, head)
    if rewrite == RewriteMode.DECLARED:
        return Decision(Move.REWRITE, head)
    predecessor = Predecessor(messages=head.messages, prompt_ids=(), completion_ids=(), tools=head.tools)
    try:
        check_extension(messages, tools, predecessor, head.response)
    except UndeclaredDiscontinuityError:
        if omits_empty_response(messages, tools, head):
            return Decision(Move.SKIP_EMPTY, head)
        if rewrite == RewriteMode.IF_NOT_EXTENSION:
            return Decision(Move.REWRITE, head)
        raise
    return Decision(Move.CONTINUE, head)
