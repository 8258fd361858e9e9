"""smol-agent's drills (models/agent_drills.py): the tool JSON of each shape is what the real libraries emit,
every drilled call is valid under the rule the evaluation scores, and names come from one side of the
held-out split."""

from __future__ import annotations

import json
import re

import pytest

from models.agent_drills import _NOUNS, _PARAMS, _ROLES, _VERBS, SHAPES, AgentDrillWriter, Offer
from models.harness_tools import (
    SDK_HANDOFF_PROMPT,
    agent_as_tool,
    handoff_tool,
    langchain_tool,
    sdk_function_tool,
)
from models.tool_drills import harness_requests, is_held_out


def test_agents_sdk_tools_are_what_the_sdk_converter_emits():
    from agents import Agent, function_tool, handoff
    from agents.models.chatcmpl_converter import Converter

    @function_tool
    def lookup_brastek(query: str, glorp_id: str, limit: str = "") -> str:
        """Find the brastek."""
        return query

    billing = Agent(name="Glorpin Reviewer", handoff_description="Knows about vaxjur.", instructions="-")
    assert Converter.tool_to_openai(lookup_brastek) == sdk_function_tool(
        "lookup_brastek", "Find the brastek.", ["query", "glorp_id"], ["limit"]
    )
    assert Converter.convert_handoff_tool(handoff(billing)) == handoff_tool(
        "Glorpin Reviewer", "Knows about vaxjur."
    )
    assert handoff_tool("Glorpin Reviewer", "")["function"]["name"] == "transfer_to_glorpin_reviewer"
    as_tool = billing.as_tool(tool_name="ask_glorpin", tool_description="Ask it.")
    assert Converter.tool_to_openai(as_tool) == agent_as_tool("ask_glorpin", "Ask it.")


def test_the_handoff_prompt_is_the_sdks():
    from agents.extensions.handoff_prompt import RECOMMENDED_PROMPT_PREFIX

    assert SDK_HANDOFF_PROMPT == RECOMMENDED_PROMPT_PREFIX


def test_langgraph_tools_are_what_langchain_converts():
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    @tool
    def find_vaxjur(city: str, topic: str = "") -> str:
        """Look up vaxjur."""
        return city

    assert convert_to_openai_tool(find_vaxjur) == langchain_tool(
        "find_vaxjur", "Look up vaxjur.", ["city"], ["topic"]
    )


def test_opencode_cases_carry_the_captured_task_tool_with_the_drawn_agents():
    captured = harness_requests()["lead_first"]["tools"][0]["function"]
    case = AgentDrillWriter(3).opencode()
    (tool,) = case.call_tools
    description = tool["function"]["description"]
    head = captured["description"][: captured["description"].index("- worker: ")]
    assert description.startswith(head) and tool["function"]["parameters"] == captured["parameters"]
    listed = re.findall(r"^- ([^:]+):", description[len(head) :], flags=re.M)
    assert set(listed) == set(case.offer.agent_types["task"][1]) and listed


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_drilled_call_is_valid_and_the_final_answer_is_text(shape, compact):
    writer = AgentDrillWriter(11)
    writer.compact = compact
    for _ in range(30):
        case = writer.case(shape)
        calls = case.call_messages[-1]["tool_calls"]
        assert calls and case.final_messages[-1]["role"] == "assistant"
        assert case.final_messages[-1]["content"] and "tool_calls" not in case.final_messages[-1]
        for call in calls:
            assert case.offer.check(call["function"]["name"], call["function"]["arguments"]) is None
        if case.target is not None:
            used = {c["function"]["name"] for c in calls} | {
                c["function"]["arguments"].get("subagent_type") for c in calls
            }
            assert case.target in used and case.target in json.dumps(
                [case.call_messages[:-1], case.call_tools]
            )


def _made_up_names(case) -> set[str]:
    """The made-up words in the names a case offers (tools, agent types, parameters)."""
    names = set(case.offer.required) | {p for ps in case.offer.required.values() for p in ps}
    names |= {t for _, types in case.offer.agent_types.values() for t in types}
    words = {w for n in names for w in re.split(r"[_\-\s]", n.lower())}
    return {w for w in words if len(w) > 3} - _FIXED


# the fixed words names are built from (roles, verbs, nouns, common parameters) and the harnesses' own names
_FIXED = {*_ROLES, *_VERBS, *_NOUNS, *_PARAMS} | {
    "task", "agent", "transfer", "description", "prompt", "subagent", "type", "input", "message", "spawn",
    "general", "purpose", "bash", "edit", "read", "file", "path", "command", "exec", "wait", "send", "close",
    "string", "triage", "workdir", "cmd", "timeout", "fork", "context", "model", "reasoning", "effort", "ids",
}  # fmt: skip


@pytest.mark.parametrize("held_out", [False, True])
def test_names_come_from_one_side_of_the_held_out_split(held_out):
    writer = AgentDrillWriter(5, held_out=held_out)
    seen = 0
    for shape in SHAPES * 10:
        words = _made_up_names(writer.case(shape))
        seen += len(words)
        assert all(is_held_out(w) == held_out for w in words), (shape, words)
    assert seen > 50


def test_the_validity_rule():
    offer = Offer(
        {"task": ("prompt", "subagent_type"), "Bash": ("command",)}, {"task": ("subagent_type", ("a-b",))}
    )
    assert offer.check("task", {"prompt": "x", "subagent_type": "a-b"}) is None
    assert "not an offered tool" in str(offer.check("bash", {"command": "ls"}))
    assert "missing" in str(offer.check("Bash", {}))
    assert "not an offered agent type" in str(offer.check("task", {"prompt": "x", "subagent_type": "a"}))
    assert "not a JSON object" in str(offer.check("Bash", ["ls"]))
