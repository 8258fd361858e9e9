"""The gateway says when a limit is too small for delegation (gateway/pipeline/advice.py): a tool call cut by
max_tokens, a compaction that cannot end; once per episode and agent. Pure: records and a real ledger."""

from __future__ import annotations

import logging

from capture.records import ChatRecord, Usage
from gateway.pipeline import advice
from gateway.pipeline.advice import compaction_loop, may_loop, say_once, tool_call_cut
from grove.receipts import CallKind
from tests.forest.kit import Episode, tokens

TOOLS = [{"type": "function", "function": {"name": "task", "parameters": {"type": "object"}}}]
CUT = '<tool_call>{"name": "task", "arguments": {"description": "a", "prompt": "Say red", "subagent_'


def record(call_id: str, content, *, finish="length", tools=TOOLS, extends=None, session="ses_a", **response):
    return ChatRecord(
        episode_id="ep", call_id=call_id, context_id=call_id.rsplit(".", 1)[0], agent=call_id.split(".")[0],
        kind=CallKind.ACTION, extends=extends, messages=[], tools=tools,
        response={"role": "assistant", "content": content, **response}, finish_reason=finish,
        usage=Usage(prompt_tokens=1200, completion_tokens=96), policy_version=0, session_id=session,
    )  # fmt: skip


def test_a_tool_call_cut_by_max_tokens_is_named_and_nothing_else_is():
    said = tool_call_cut(record("parent.0.c0", CUT))
    assert said is not None and "96 tokens" in said and "limit.output" in said and "parent.0.c0" in said
    assert tool_call_cut(record("parent.0.c0", CUT, finish="stop")) is None  # ended by itself
    assert tool_call_cut(record("parent.0.c0", "a long answer in words")) is None  # cut, no tool call
    assert tool_call_cut(record("parent.0.c0", CUT, tools=None)) is None  # no tools offered
    whole = {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "task", "arguments": "{}"}}]}
    assert tool_call_cut(record("parent.0.c0", "", **whole)) is None  # parsed: the harness got it


def test_a_second_rewrite_right_after_a_one_call_rewrite_is_a_compaction_loop():
    ep = Episode()
    ep.root("worker.0", "worker")
    ep.call("worker.0.c0", "worker.0", tokens([1, 2], [3], [-1.0]))
    ep.rewrite("worker.1", "worker", of="worker.0")  # the first compaction: fine
    first = record("worker.1.c0", "red", finish="stop")
    assert may_loop(first) and compaction_loop(ep.ledger.summary(), first) is None
    ep.call("worker.1.c0", "worker.1", tokens([4, 5], [6], [-1.0]))
    ep.rewrite("worker.2", "worker", of="worker.1")  # compacted again after its one call
    again = record("worker.2.c0", "red", finish="stop")
    summary_before_worker_3 = ep.ledger.summary()
    said = compaction_loop(summary_before_worker_3, again)
    assert said is not None and "'worker.1'" in said and "1200 tokens" in said and "limit.context" in said
    # a rewrite after real work (two calls in the rewritten context) is an ordinary compaction
    ep.call("worker.2.c0", "worker.2", tokens([7, 8], [9], [-1.0]))
    ep.call("worker.2.c1", "worker.2", tokens([7, 8, 9, 10], [11], [-1.0]), extends="worker.2.c0")
    ep.rewrite("worker.3", "worker", of="worker.2")
    assert compaction_loop(ep.ledger.summary(), record("worker.3.c0", "red", finish="stop")) is None
    assert not may_loop(record("worker.0.c1", "x", extends="worker.0.c0"))
    # a program's rewrites (no OpenCode session) are its own filter's business: no advice
    program = record("worker.2.c0", "red", finish="stop", session=None)
    assert not may_loop(program) and compaction_loop(summary_before_worker_3, program) is None


def test_advice_is_logged_once_per_episode_agent_and_kind(caplog, monkeypatch):
    monkeypatch.setattr(advice, "_said", set())
    cut = record("parent.0.c0", CUT)
    with caplog.at_level(logging.WARNING, logger="grove.gateway"):
        for _ in range(3):
            assert say_once(cut, "tool_call_cut", tool_call_cut(cut)) is not None  # the header, each time
    assert [r.getMessage() for r in caplog.records] == [tool_call_cut(cut)]
