"""Harness-shaped histories: a request that leaves out an empty assistant turn (OpenCode
drops EOS-only replies) continues the empty call's parent; a post-compaction request after an empty
summary is still OpenCode's recognised rewrite. Pure: decisions and rendering with the tiny tokenizer."""

from __future__ import annotations

import pytest

from capture.records import ChatRecord, Usage
from chat.render import Predecessor, render_chat, render_root
from gateway.pipeline import opencode
from gateway.pipeline.continuation import Move, UndeclaredDiscontinuityError, decide, is_empty_response
from gateway.pipeline.identity import RewriteMode
from grove.receipts import CallKind

SYSTEM = {"role": "system", "content": "You are an agent."}
U1 = {"role": "user", "content": "Read a.txt"}
U2 = {"role": "user", "content": "And now?"}
U3 = {"role": "user", "content": "Still there?"}
OK = {"role": "assistant", "content": "ok"}
EMPTY = {"role": "assistant", "content": ""}
TOOLS = [{"type": "function", "function": {"name": "task", "parameters": {"type": "object"}}}]


def record(messages, response, call_id, extends=None, tools=None) -> ChatRecord:
    return ChatRecord(
        episode_id="ep/1", call_id=call_id, context_id="parent.0", agent="parent", kind=CallKind.ACTION,
        extends=extends, messages=messages, tools=tools, response=response, finish_reason="stop",
        usage=Usage(prompt_tokens=10, completion_tokens=1), policy_version=0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "response, empty",
    [
        (EMPTY, True),
        ({"role": "assistant", "content": None}, True),
        ({"role": "assistant", "content": " \n"}, True),
        ({"role": "assistant", "content": [{"type": "text", "text": ""}]}, True),
        (OK, False),
        ({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "t"}}]}, False),
    ],
)
def test_what_counts_as_an_empty_response(response, empty):
    assert is_empty_response(response) is empty


def test_a_request_without_the_heads_empty_turn_skips_it():
    head = record([SYSTEM, U1, OK, U2], EMPTY, "parent.0.c1", extends="parent.0.c0")
    decision = decide([SYSTEM, U1, OK, U2, U3], None, head, RewriteMode.NONE)
    assert decision.move == Move.SKIP_EMPTY and decision.head == head
    # with the empty turn kept, it is an ordinary continuation
    assert decide([SYSTEM, U1, OK, U2, EMPTY, U3], None, head, RewriteMode.NONE).move == Move.CONTINUE
    # the same request is a retry, checked first
    assert decide([SYSTEM, U1, OK, U2], None, head, RewriteMode.NONE).move == Move.RETRY


@pytest.mark.parametrize(
    "response, messages, tools",
    [
        (OK, [SYSTEM, U1, OK, U2, U3], None),  # the head's reply was not empty: a real discontinuity
        (EMPTY, [SYSTEM, U1, OK, {"role": "user", "content": "edited"}, U3], None),  # history edited
        (EMPTY, [SYSTEM, U1, OK, U2, {"role": "assistant", "content": "made up"}], None),  # new assistant
        (EMPTY, [SYSTEM, U1, OK, U2, U3], TOOLS),  # the tools changed
    ],
)
def test_only_an_omitted_empty_turn_is_skipped(response, messages, tools):
    head = record([SYSTEM, U1, OK, U2], response, "parent.0.c1", extends="parent.0.c0")
    with pytest.raises(UndeclaredDiscontinuityError):
        decide(messages, tools, head, RewriteMode.NONE)


def test_the_skipping_request_renders_as_a_continuation_of_the_empty_calls_parent(tiny_tokenizer):
    """The call after the skip extends the parent (c0): its prompt is c0's prompt + c0's completion + the
    rendering of the empty call's user message and the new one: what a fresh render of the request's
    own messages (no empty turn) gives. The engine sees exactly the history the harness sent."""
    tok = tiny_tokenizer
    prompt0 = render_root(tok, [SYSTEM, U1])
    completion0 = [*tok.encode("ok", add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    parent = Predecessor(messages=[SYSTEM, U1], prompt_ids=prompt0, completion_ids=completion0, response=OK)
    rendered = render_chat(tok, [SYSTEM, U1, OK, U2, U3], None, parent)
    assert rendered.continuation
    assert rendered.prompt_ids == render_root(tok, [SYSTEM, U1, OK, U2, U3])


def test_post_compaction_after_an_empty_summary_is_a_recognised_rewrite():
    question = {"role": "user", "content": "What did we do so far?"}
    go_on = {"role": "user", "content": "Continue if you have next steps, or stop and ask for clarification."}
    for messages in ([SYSTEM, question, OK, go_on], [SYSTEM, question, go_on]):
        ident = opencode.identify({"x-session-id": "ses_a"}, messages, TOOLS, set())
        assert ident.rewrite == RewriteMode.IF_NOT_EXTENSION
    # two user turns that are not OpenCode's compaction pair are not
    other = [SYSTEM, U1, go_on]
    assert opencode.identify({"x-session-id": "ses_a"}, other, TOOLS, set()).rewrite == RewriteMode.NONE
