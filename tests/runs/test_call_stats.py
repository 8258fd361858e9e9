"""Tool-call validity and compaction metrics: from how each completion parsed (the generate activity's
classification with the real hermes parser), through the call receipts of a real Ledger, to the
step's rollout metrics and tracked scalars. Every count is fixed by how the episodes are built."""

from __future__ import annotations

import json

from activities.generate import assistant_of, tool_call_outcome
from chat.tool_parsers import HermesParser
from grove.contracts import EpisodeResult, StepRecord
from grove.receipts import ToolCallOutcome
from grove.store_layout import staging_key
from ledger.ledger import Ledger
from tests.forest.kit import SAMPLED, Episode, tokens
from workflows.step_metrics import call_stats, rollout_metrics, step_scalars

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
WELL_FORMED = '<tool_call>\n{"name": "search", "arguments": {"q": "grove"}}\n</tool_call>'
UNCLOSED = '<tool_call>\n{"name": "search", "arguments": {"q": '
BAD_JSON = "<tool_call>\n{name: search}\n</tool_call>"
PLAIN = "The answer is 42."


def outcome(text: str, tools=TOOLS) -> ToolCallOutcome | None:
    return tool_call_outcome(HermesParser().parse(text, id_prefix="c"), tools)


def test_a_completion_is_classified_only_when_its_request_offered_tools():
    assert outcome(WELL_FORMED) == ToolCallOutcome.WELL_FORMED
    assert outcome(WELL_FORMED + "\n" + WELL_FORMED) == ToolCallOutcome.WELL_FORMED
    assert outcome(UNCLOSED) == ToolCallOutcome.MALFORMED
    assert outcome(BAD_JSON) == ToolCallOutcome.MALFORMED
    assert outcome(PLAIN) == ToolCallOutcome.NONE
    # no tools offered: a tool-call-looking text is not counted either way
    assert outcome(WELL_FORMED, tools=None) is None
    assert outcome(UNCLOSED, tools=[]) is None


def test_a_request_that_offered_no_tools_gets_the_text_and_no_tool_calls():
    offered = assistant_of(HermesParser(), WELL_FORMED, "c", TOOLS).message()
    assert offered["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "grove"}'}
    for tools in (None, []):
        plain = assistant_of(HermesParser(), WELL_FORMED, "c", tools)
        assert plain.message() == {"role": "assistant", "content": WELL_FORMED}
        assert (plain.tool_calls, plain.malformed) == ([], None)


def complete(ep: Episode, call_id: str, context_id: str, extends: str | None, tool_call) -> None:
    ep.admit(call_id, context_id, extends)
    prompt = [1, 2]
    if extends is not None:  # a continuation's prompt starts with its parent's prompt + completion
        parent = ep.staged[extends]
        prompt = [*parent.prompt_ids.tolist(), *parent.completion_ids.tolist(), 4]
    arrays = tokens(prompt, [3], [-1.0])
    ep.staged[call_id] = arrays
    ep.ledger.complete(
        call_id, staging_key(ep.episode_id, call_id), arrays.digests(), 1, "stop", sampling=SAMPLED,
        tool_call=tool_call,
    )  # fmt: skip


def built_episode() -> Episode:
    """A parent with 3 tool-offering calls, compacted twice, and a spawned worker: 5 calls offered
    tools (3 well-formed, 1 malformed, 1 plain), 1 offered none, 2 rewrite contexts."""
    ep = Episode()
    ep.root("p0", "parent")
    complete(ep, "c1", "p0", None, ToolCallOutcome.WELL_FORMED)
    complete(ep, "c2", "p0", "c1", ToolCallOutcome.MALFORMED)
    complete(ep, "c3", "p0", "c2", None)  # the summary call: no tools offered
    ep.rewrite("p1", "parent", of="p0")
    complete(ep, "c4", "p1", None, ToolCallOutcome.NONE)
    ep.rewrite("p2", "parent", of="p1")
    complete(ep, "c5", "p2", None, ToolCallOutcome.WELL_FORMED)
    ep.spawn("w0", "worker", by="c1")
    complete(ep, "w1", "w0", None, ToolCallOutcome.WELL_FORMED)
    return ep


def stats_of(ledger: Ledger) -> dict[str, int]:
    return call_stats(ledger.calls.values(), (c.record for c in ledger.contexts.values()))


def test_call_stats_count_the_ledgers_receipts_and_rewrite_contexts():
    ledger = built_episode().ledger
    assert stats_of(ledger) == {
        "tools_offered": 5,
        "tool_calls_well_formed": 3,
        "tool_calls_malformed": 1,
        "tool_calls_none": 1,
        "rewrite_contexts": 2,
        "summary_calls": 0,  # the summary call here is an action (no kind SUMMARY)
    }
    # the outcome lives in the receipts, so it survives the ledger's hand-over through JSON
    assert stats_of(Ledger.model_validate(json.loads(ledger.model_dump_json()))) == stats_of(ledger)


def test_a_ledger_without_tools_or_rewrites_counts_zeros():
    ep = Episode()
    ep.root("a", "parent")
    complete(ep, "c1", "a", None, None)
    assert stats_of(ep.ledger) == {
        "tools_offered": 0,
        "tool_calls_well_formed": 0,
        "tool_calls_malformed": 0,
        "tool_calls_none": 0,
        "rewrite_contexts": 0,
        "summary_calls": 0,
    }


def result(status: str, stats: dict[str, int]) -> EpisodeResult:
    return EpisodeResult(
        episode_id="e", group_id="g", task_id="t", status=status, reward=1.0, rows_key="k",
        num_rows=1, eligible_tokens=1, counts={"selected": 1}, call_stats=stats,
    )  # fmt: skip


def stats(offered: int, well: int, malformed: int, none: int, rewrites: int) -> dict[str, int]:
    return {
        "tools_offered": offered,
        "tool_calls_well_formed": well,
        "tool_calls_malformed": malformed,
        "tool_calls_none": none,
        "rewrite_contexts": rewrites,
    }


def test_step_fractions_are_over_all_tool_offering_calls_of_the_step():
    results = [
        result("ok", stats(4, 3, 1, 0, 1)),
        result("failed", stats(2, 0, 2, 0, 0)),  # a failed episode's malformed calls count too
        result("ok", stats(2, 1, 0, 1, 2)),
        result("failed", {}),  # a terminated child reported nothing: left out
    ]
    got = rollout_metrics(results)
    # 8 tool-offering calls: 4 well-formed, 3 malformed, 1 plain; 3 rewrites over 3 reporting episodes
    assert got["tool_calls_well_formed_fraction"] == 0.5
    assert got["tool_calls_malformed_fraction"] == 0.375
    assert got["tool_calls_none_fraction"] == 0.125
    assert got["compactions_per_episode"] == 1.0
    record = StepRecord(step=1, mean_reward=1.0, episodes=4, failed_episodes=2, policy_version=1, rollout=got)
    scalars = step_scalars(record)
    assert scalars["rollout/tool_calls_malformed_fraction"] == 0.375
    assert scalars["rollout/compactions_per_episode"] == 1.0


def test_a_step_whose_calls_offered_no_tools_reports_compactions_but_no_fractions():
    got = rollout_metrics([result("ok", stats(0, 0, 0, 0, 1)), result("ok", stats(0, 0, 0, 0, 0))])
    assert got["compactions_per_episode"] == 0.5
    assert not any(k.startswith("tool_calls_") for k in got)
