"""The stock harness drills (models/stock_drills.py): their text is what the gateway makes of the requests
stock Claude Code 2.1.332 and Codex 0.171.0 sent, every drilled call is valid, nothing of the captured
conversation's own values is left in a drill, and a capture that moved a replaced literal is refused."""

from __future__ import annotations

import json
import re

import pytest

import models.stock_drills as stock_drills
from cli.harness_chat import SOURCES, TEXT_DIR, converted
from models.agent_drills import AgentDrillWriter
from models.agent_eval import held_out_cases
from models.stock_drills import (
    ALL_SHAPES,
    STOCK_SHAPES,
    ClaudeCodeText,
    StockDrills,
    StockTextError,
    draw_case,
)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_committed_chat_form_is_the_gateways_conversion(source):
    """models/harness_text/*.chat.json equal a fresh run of the gateway's parsers over the captures
    (`python -m cli.harness_chat` rewrites them)."""
    target, _ = SOURCES[source]
    assert (TEXT_DIR / target).read_text() == converted(source)


# values of the captured conversations that a drill must have replaced by drawn ones
_CAPTURED_VALUES = (
    "zorblat",
    "quintex",
    "Repeats the word it is given",
    "/tmp/grove-capture/",
    "2026-12-07",
    "ad441bcc167dd2914",
    "01a2503a-71ff-7302-be90-b85017c082ab",
    "You are the lead. Give each word",
)


@pytest.mark.parametrize("shape", STOCK_SHAPES)
def test_every_drilled_call_is_valid_and_the_answer_repeats_the_subagents(shape):
    writer = AgentDrillWriter(21)
    stock = StockDrills(writer)
    for _ in range(25):
        case = draw_case(writer, shape, stock)
        assert case.continued
        calls = case.call_messages[-1]["tool_calls"]
        for call in calls:
            assert case.offer.check(call["function"]["name"], call["function"]["arguments"]) is None
        if case.target is not None:
            assert case.target in {c["function"]["arguments"].get("subagent_type") for c in calls}
        answer = case.final_messages[-1]
        assert answer["role"] == "assistant" and "tool_calls" not in answer and answer["content"]
        # every report the subagents sent back reaches the user, and the answer adds nothing of its own
        later = json.dumps(case.final_messages[len(case.call_messages) : -1])
        assert all(word in later for word in answer["content"].split())
        (sub, _), *_ = case.extra
        assert sub[-1]["content"] in answer["content"]
        text = json.dumps([case.final_messages, case.final_tools, case.extra])
        assert not [v for v in _CAPTURED_VALUES if v in text], text[:200]


def test_claude_code_lists_the_agent_types_where_stock_claude_code_does():
    """In 2.1.332 the Agent tool's description says the types are listed in a system message; a drill
    lists the case's types there (the environment message after the user's request), and no other."""
    case = StockDrills(AgentDrillWriter(4)).claude_code_stock()
    user, env = case.call_messages[1], case.call_messages[2]
    assert user["role"] == "user" and env["role"] == "system"
    listed = re.findall(r"^- ([^:]+): .* \(Tools: All tools\)$", env["content"], flags=re.M)
    assert sorted(listed) == sorted(case.offer.agent_types["Agent"][1])
    assert "Available agent types are listed in messages from the system" in json.dumps(case.call_tools)


def test_codex_offers_the_multi_agent_tools_without_their_namespace():
    case = StockDrills(AgentDrillWriter(4)).codex_stock()
    names = {t["function"]["name"] for t in case.call_tools}
    assert {"spawn_agent", "wait_agent", "send_input", "close_agent", "apply_patch"} <= names
    waits = [m for m in case.final_messages if m.get("tool_calls")][1]["tool_calls"]
    outputs = [m["content"] for m in case.final_messages if m["role"] == "tool"][:-1]  # the spawns'
    spawned = [json.loads(o)["agent_id"] for o in outputs]
    assert waits[0]["function"]["arguments"]["targets"] == spawned  # it waits on the ids it was given


def test_a_capture_without_a_replaced_literal_is_refused(monkeypatch):
    real = stock_drills._requests(stock_drills.CLAUDE_CODE_TEXT)
    moved = json.loads(json.dumps(real))
    env = moved["lead_first"]["messages"][2]
    env["content"] = env["content"].replace("Available agent types for the Agent tool:\n- worker", "- worker")
    env["content"] = env["content"].replace("- worker: Repeats", "- helper: Repeats")
    monkeypatch.setattr(stock_drills, "_requests", lambda path: moved)
    with pytest.raises(StockTextError, match="lead environment"):
        ClaudeCodeText()


def test_the_evaluation_draws_the_stock_shapes_after_the_others():
    """Adding the stock shapes left the other shapes' held-out cases as they were (drawn first)."""
    cases = held_out_cases(2)
    assert list(cases)[-2:] == list(STOCK_SHAPES)
    assert all(c.shape == s for s in cases for c in cases[s])


def test_no_drill_uses_the_harness_benchs_configuration():
    """bench/harness_drive.py measures the policy on a configuration no drill used: none of its prompts,
    agent descriptions or request wording appears in a drill of any shape."""
    import bench.harness_drive as drive

    texts = [drive.LEAD_PROMPT, drive.CODEX_INSTRUCTIONS, *drive.FACT_FINDER, *drive.CONDENSER]
    # ("condenser" alone is one of the role words agent names are built from: models/agent_drills.py)
    texts += ["I need two things", "Tell me both results", "fact-finder"]
    writer = AgentDrillWriter(2)
    stock = StockDrills(writer)
    drawn = json.dumps(
        [
            [c.final_messages, c.call_tools, c.extra]
            for shape in ALL_SHAPES
            for c in (draw_case(writer, shape, stock) for _ in range(40))
        ]
    )
    assert not [t for t in texts if t in drawn]
