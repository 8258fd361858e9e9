"""Continuation decisions of gateway/pipeline/continuation.py and the errors that name the fix (unit tests, no
services): what a request is to its context's head, compared type-strictly."""

from __future__ import annotations

import json

import pytest

from gateway.pipeline.continuation import Move, UndeclaredDiscontinuityError, decide
from gateway.pipeline.hints import (
    MissingIdentityHeadersError,
    UndeclaredAuxiliaryCallError,
    UndeclaredRewriteError,
    diagnose,
)
from gateway.pipeline.identity import (
    RewriteMode,
    grove_identity,
)
from tests.gateway.chat_kit import SYSTEM, TOOL_RESPONSE, TOOLS, USER, record

# ---------------------------------------------------------------------------------------------- decision


def test_a_generated_tool_call_reserialised_compact_is_a_continuation():
    head = record([SYSTEM, USER], TOOL_RESPONSE, TOOLS)
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_x_0",
                "type": "function",
                "function": {"name": "read", "arguments": '{"n":2,"path":"a.txt"}'},
            }
        ],
    }
    messages = [SYSTEM, USER, echoed, {"role": "tool", "tool_call_id": "call_x_0", "content": "hello"}]
    assert decide(messages, TOOLS, head, RewriteMode.NONE).move == Move.CONTINUE


OK = {"role": "assistant", "content": "ok"}


def test_decisions_root_retry_rewrite():
    head = record([SYSTEM, USER], OK)
    assert decide([SYSTEM, USER], None, None, RewriteMode.NONE).move == Move.ROOT
    retry = decide([SYSTEM, USER], None, head, RewriteMode.NONE)
    assert retry.move == Move.RETRY and retry.head == head
    extension = [SYSTEM, USER, OK, {"role": "user", "content": "more"}]
    assert decide(extension, None, head, RewriteMode.NONE).move == Move.CONTINUE
    assert decide(extension, None, head, RewriteMode.DECLARED).move == Move.REWRITE  # declared wins
    assert decide(extension, None, head, RewriteMode.IF_NOT_EXTENSION).move == Move.CONTINUE
    other = [SYSTEM, {"role": "user", "content": "new topic"}]
    assert decide(other, None, head, RewriteMode.IF_NOT_EXTENSION).move == Move.REWRITE
    # the same messages with other tools is neither a continuation nor a retry
    with pytest.raises(UndeclaredDiscontinuityError):
        decide([SYSTEM, USER], TOOLS, head, RewriteMode.NONE)


@pytest.mark.parametrize("mode", list(RewriteMode))
def test_a_repeated_request_is_a_retry_in_every_rewrite_mode(mode):
    """The OpenAI client re-sends a request (headers included) after a timeout: a re-sent
    `x-grove-rewrite: 1` request, or OpenCode's post-compaction request sent twice, must discard the
    first response instead of opening a second rewrite and keeping the first one selected."""
    head = record([SYSTEM, USER], OK)
    decision = decide([SYSTEM, USER], None, head, mode)
    assert decision.move == Move.RETRY and decision.head == head
    # the retry of a rewrite request lands in the rewrite context, whose head is its first call (a root)
    rewritten = [SYSTEM, {"role": "user", "content": "Summary: read a.txt. Continue."}]
    first = record(rewritten, OK, call_id="parent.1.c0")
    assert decide(rewritten, None, first, mode).move == Move.RETRY


@pytest.mark.parametrize(
    ("seen", "sent"),
    [
        ('{"path": "a.txt", "recursive": true}', '{"path": "a.txt", "recursive": 1}'),
        ('{"path": "a.txt", "n": 1}', '{"path": "a.txt", "n": true}'),
        ('{"path": "a.txt", "n": 10}', '{"path": "a.txt", "n": 10.0}'),
        ('{"path": "a.txt", "n": 0}', '{"path": "a.txt", "n": false}'),
        ('{"path": "a.txt", "n": [1, 2.5]}', '{"path": "a.txt", "n": [1.0, 2.5]}'),
    ],
)
def test_history_comparison_is_type_strict(seen, sent):
    """`true == 1` and `10 == 10.0` in Python; in JSON they are different values, so a history with the
    model's `true` turned into `1` is not what the model saw: neither a continuation nor a retry."""

    def call(args: str) -> dict:
        return {"id": "call_x_0", "type": "function", "function": {"name": "read", "arguments": args}}

    response = {"role": "assistant", "content": None, "tool_calls": [call(seen)]}
    head = record([SYSTEM, USER], response, TOOLS)
    changed = {"role": "assistant", "content": "", "tool_calls": [call(sent)]}
    tool = {"role": "tool", "tool_call_id": "call_x_0", "content": "hello"}
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        decide([SYSTEM, USER, changed, tool], TOOLS, head, RewriteMode.NONE)
    assert (err.value.index, err.value.field) == (2, "tool_calls")
    # the same values re-serialised (spacing, key order) still continue
    same = {"role": "assistant", "content": "", "tool_calls": [call(json.dumps(json.loads(seen)))]}
    assert decide([SYSTEM, USER, same, tool], TOOLS, head, RewriteMode.NONE).move == Move.CONTINUE
    # a repeated prompt whose earlier tool call changed type is not a retry either
    retry_head = record([SYSTEM, USER, response, tool], OK, TOOLS, call_id="parent.0.c1")
    with pytest.raises(UndeclaredDiscontinuityError):
        decide([SYSTEM, USER, changed, tool], TOOLS, retry_head, RewriteMode.NONE)


def test_tool_lists_are_compared_type_strictly():
    strict = [{"type": "function", "function": {"name": "read", "strict": True, "parameters": {}}}]
    loose = [{"type": "function", "function": {"name": "read", "strict": 1, "parameters": {}}}]
    head = record([SYSTEM, USER], OK, strict)
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        decide([SYSTEM, USER, OK, MORE], loose, head, RewriteMode.NONE)
    assert err.value.index is None
    with pytest.raises(UndeclaredDiscontinuityError):
        decide([SYSTEM, USER], loose, head, RewriteMode.NONE)  # not a retry either


MORE = {"role": "user", "content": "more"}


@pytest.mark.parametrize(
    ("head_prompt", "messages", "index", "field"),
    [
        ([SYSTEM, USER], [SYSTEM, {"role": "user", "content": "Read b.txt"}, OK, MORE], 1, "content"),  # edit
        (
            [SYSTEM, USER],
            [SYSTEM, USER, {"role": "assistant", "content": "OK"}, MORE],
            2,
            "content",
        ),  # response
        (
            [SYSTEM, USER],
            [SYSTEM, USER, OK, {"role": "assistant", "content": "x"}],
            3,
            "role",
        ),  # made-up turn
        ([SYSTEM, USER, MORE], [SYSTEM, USER], 2, "role"),  # a shorter history
        ([SYSTEM, USER], [SYSTEM, {**USER, "name": "bob"}, OK, MORE], 1, "name"),
    ],
)
def test_undeclared_discontinuity_names_the_first_differing_message(head_prompt, messages, index, field):
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        decide(messages, None, record(head_prompt, OK), RewriteMode.NONE)
    assert (err.value.index, err.value.field) == (index, field)


def _diagnosed(messages, tools, headers, head, summaries=()):
    """The error the gateway answers for `messages` against `head` (they must not extend it)."""
    identity = grove_identity(headers)
    with pytest.raises(UndeclaredDiscontinuityError) as err:
        decide(messages, tools, head, identity.rewrite)
    return diagnose(err.value, messages, tools, identity, head, list(summaries))


def test_common_wiring_mistakes_get_errors_that_name_the_fixing_header():
    head = record([SYSTEM, USER], OK, TOOLS)
    # a worker without any identity header lands in the parent's context
    worker = [{"role": "system", "content": "You are a worker."}, {"role": "user", "content": "Count."}]
    err = _diagnosed(worker, TOOLS, {}, head)
    assert isinstance(err, MissingIdentityHeadersError) and "x-grove-agent" in str(err)
    assert "x-grove-spawned-by" in str(err) and err.index == 0
    # the parent editing its own history (same start, an assistant turn) is a plain discontinuity
    edited = [SYSTEM, {"role": "user", "content": "Read b.txt"}, OK, MORE]
    assert type(_diagnosed(edited, TOOLS, {}, head)) is UndeclaredDiscontinuityError
    # the same request naming its agent is a plain discontinuity
    assert type(_diagnosed(worker, TOOLS, {"x-grove-agent": "parent"}, head)) is UndeclaredDiscontinuityError
    # a summary call (no tools, one user message) without the auxiliary header
    summarise = [{"role": "user", "content": "Summarise the conversation: ..."}]
    err = _diagnosed(summarise, None, {"x-grove-agent": "parent"}, head)
    assert isinstance(err, UndeclaredAuxiliaryCallError) and "x-grove-call-kind: auxiliary" in str(err)
    # the history rewritten with the summary an auxiliary call returned, without the rewrite header
    text = "We read a.txt and found the answer 42."
    aux = record([*summarise], {"role": "assistant", "content": text}, call_id="parent~aux.0.c0")
    rewritten = [SYSTEM, {"role": "user", "content": f"Summary so far: {text}"}, MORE]
    err = _diagnosed(rewritten, TOOLS, {"x-grove-agent": "parent"}, head, [aux])
    assert isinstance(err, UndeclaredRewriteError) and "x-grove-rewrite: 1" in str(err)
    assert "'parent~aux.0.c0'" in str(err) and (err.index, err.field) == (1, "content")
    # LangChain's SummarizationMiddleware message is recognised by its text alone
    langchain = [SYSTEM, {"role": "user", "content": "Here is a summary of the conversation to date:\n\nx"}]
    assert isinstance(_diagnosed(langchain, TOOLS, {}, head), UndeclaredRewriteError)


def test_a_hand_written_summary_call_without_its_header_is_told_to_be_auxiliary_not_a_rewrite():
    """A program's own summary call, sent under the agent's name with the agent's tools (or none) and
    without `x-grove-call-kind: auxiliary`: the hint names the auxiliary header; declaring a rewrite on
    it would train the summary as an action and retire the agent's context."""
    head = record([SYSTEM, USER, OK, MORE], OK, TOOLS)
    transcript = {"role": "user", "content": "user: Read a.txt\nassistant: I read it, the answer is 42."}
    summarizer = {"role": "system", "content": "You are a careful summarizer."}
    for asking in (
        [SYSTEM, {"role": "user", "content": f"Summarize the conversation so far:\n{transcript['content']}"}],
        [summarizer, transcript],
        [SYSTEM, USER, {"role": "user", "content": "Please write a short summary of the work above."}],
    ):
        with_tools = _diagnosed(asking, TOOLS, {"x-grove-agent": "parent"}, head)
        assert isinstance(with_tools, UndeclaredAuxiliaryCallError), (asking, str(with_tools))
        assert "asks for a summary" in str(with_tools) and "x-grove-call-kind: auxiliary" in str(with_tools)
        without = _diagnosed(asking, None, {"x-grove-agent": "parent"}, head)
        assert isinstance(without, UndeclaredAuxiliaryCallError) and "auxiliary" in str(without)


def test_a_history_replaced_by_a_summary_is_an_undeclared_rewrite_whoever_wrote_it():
    """The probe: the parent's history replaced by a summary the harness wrote itself (no auxiliary call of
    the agent returned it), sent without `x-grove-rewrite` and without identity headers. Refused (right),
    but the code named the identity headers; the cause is the missing rewrite declaration."""
    head = record([SYSTEM, USER, OK, MORE], OK, TOOLS)
    compacted = [SYSTEM, {"role": "user", "content": "Summary of the conversation so far: we read a.txt."}]
    err = _diagnosed(compacted, TOOLS, {}, head)
    assert isinstance(err, UndeclaredRewriteError) and "x-grove-rewrite: 1" in str(err)
    assert (err.index, err.field) == (1, "content")
    # another agent's first request (other tools) stays an identity-header mistake
    count = [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}]
    worker = [SYSTEM, {"role": "user", "content": "Summarise a.txt"}]
    assert isinstance(_diagnosed(worker, count, {}, head), MissingIdentityHeadersError)
