"""bench/harness_calls.py: the tally `python -m bench.harness_drive` prints, on hand-written archives whose
expected counts are written out here (not computed with the module's code)."""

from __future__ import annotations

import json

from bench.harness_calls import NO_RECORD, Rules, Tally, check_call, offered, tally_episode
from capture.call_archive import ArchivedCall, CallArchive
from grove.receipts import CallReceipt, CallState, ContextOrigin, ContextRecord
from grove.sampling import SamplingProcessing

AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "Agent",
        "description": "Launch a new agent.\n\nAvailable agent types:\n- fact-finder: ...\n- condenser: ...",
        "parameters": {
            "type": "object",
            "properties": {
                "description": {"type": "string"},
                "prompt": {"type": "string"},
                "subagent_type": {"type": "string"},
                "model": {"type": "string", "enum": ["sonnet", "opus", "haiku"]},
            },
            "required": ["description", "prompt"],
        },
    },
}
SPAWN_TOOL = {
    "type": "function",
    "function": {
        "name": "spawn_agent",
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": []},
    },
}
CC_RULES = Rules(agent_types={"Agent": ("subagent_type", ("fact-finder", "condenser"))})


def agent_call(i: int, **arguments) -> dict:
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "Agent", "arguments": json.dumps(arguments)},
    }


def call(call_id: str, context: str, response: dict | None, state=CallState.SELECTED, t: float = 0.7):
    receipt = CallReceipt(
        call_id=call_id, context_id=context, agent=context, state=state,
        sampling=SamplingProcessing(temperature=t, top_p=1.0) if response is not None else None,
    )  # fmt: skip
    return ArchivedCall(receipt=receipt, response=response)


def archive(calls: list[ArchivedCall]) -> CallArchive:
    contexts = [
        ContextRecord(context_id="lead", agent="parent", origin=ContextOrigin.ROOT),
        ContextRecord(context_id="ff", agent="fact-finder", origin=ContextOrigin.SPAWN, spawned_by_call="c0"),
        ContextRecord(context_id="cd", agent="condenser", origin=ContextOrigin.SPAWN, spawned_by_call="c0"),
    ]
    return CallArchive(episode_id="e", group_id="g", contexts=contexts, calls=calls)


def test_each_call_is_valid_only_with_an_offered_tool_its_arguments_and_a_configured_type():
    good = agent_call(0, description="look up", prompt="What is a brastek?", subagent_type="fact-finder")
    wrong_type = agent_call(1, description="d", prompt="p", subagent_type="worker")
    no_prompt = agent_call(2, description="d", subagent_type="condenser")
    bad_enum = agent_call(3, description="d", prompt="p", subagent_type="condenser", model="gpt-5")
    not_offered = {"id": "call_4", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    lead = {
        "role": "assistant",
        "content": None,
        "tool_calls": [good, wrong_type, no_prompt, bad_enum, not_offered],
    }
    garbled = {"role": "assistant", "content": '<tool_call>{"name": "Agent", <tool_call>{"x"'}
    answer = {"role": "assistant", "content": "A brastek is a harbour crane."}
    calls = [
        call("c0", "lead", lead),
        call("c1", "ff", answer),
        call("c2", "lead", garbled, t=1.0),
        call("c3", "lead", None, state=CallState.FAILED),  # no response: not the policy's reply
        call("c4", "lead", {"role": "assistant", "content": None, "tool_calls": [good]}),
    ]
    records = {cid: {"tools": [AGENT_TOOL]} for cid in ("c0", "c1", "c2")}  # c4's record is missing
    tally = tally_episode(archive(calls), records, CC_RULES, ok=True, final_answer=False)
    assert (tally.calls, tally.lead_calls, tally.text_replies) == (4, 3, 1)
    assert (tally.written, tally.parsed, tally.valid) == (8, 6, 1)
    assert tally.invalid == {
        "'Agent': subagent_type='worker' is not an offered agent type ['fact-finder', 'condenser']": 1,
        "'Agent': required arguments ['prompt'] missing": 1,
        "'Agent': model='gpt-5' is not one of its enum": 1,
        "'Bash' is not an offered tool": 1,
        "the reply's tool-call text does not parse (the harness got plain text)": 2,
        NO_RECORD: 1,
    }
    assert tally.by_tool == {"Agent": 5, "Agent valid": 1, "Bash": 1, "(unparsed)": 2}
    # fact-finder answered; condenser's context was opened but never completed a call
    assert tally.subagents_ran == 1 and tally.subagent_names == {"fact-finder": 1}
    assert tally.temperatures == {"0.7": 3, "1": 1}
    assert (tally.episodes, tally.episodes_ok, tally.final_answers) == (1, 1, 0)


def test_spawn_agent_needs_a_message_or_items_and_tallies_add_up():
    rules = Rules(one_of={"spawn_agent": ("message", "items")})
    tools = offered([SPAWN_TOOL])
    assert check_call("spawn_agent", {"message": "What is a brastek?"}, tools, rules) is None
    assert check_call("spawn_agent", {"items": []}, tools, rules) is None
    assert check_call("spawn_agent", {}, tools, rules) == "'spawn_agent': none of ['message', 'items'] given"
    assert (
        check_call("spawn_agent", ["message"], tools, rules)
        == "'spawn_agent': arguments are not a JSON object"
    )
    one = Tally(episodes=1, written=3, valid=2)
    one.by_tool.update({"spawn_agent": 3})
    two = Tally(episodes=2, written=1, valid=1, final_answers=1)
    two.by_tool.update({"spawn_agent": 1})
    one.add(two)
    assert (one.episodes, one.written, one.valid, one.final_answers) == (3, 4, 3, 1)
    assert one.by_tool == {"spawn_agent": 4}
    assert one.as_json()["valid_share"] == 0.75


def test_the_drivers_episodes_are_accepted_by_each_harness_setup():
    """Each harness's episode spec from bench/harness_drive.py passes the runner's own setup checks, offers
    both custom agent types and asks for both jobs."""
    from bench.harness_drive import AGENT_TYPES, LEAD, configs, episode_spec
    from grove.sampling import SamplingConfig
    from harnesses import claude_code, codex, opencode

    sampling = SamplingConfig(max_tokens=256, temperature=0.7)
    specs = {name: episode_spec(name, 3, cfg, sampling, 600.0) for name, cfg in configs().items()}
    cc = claude_code.setup_for(specs["claude-code"].task, specs["claude-code"].harness.claude_code)
    assert sorted(cc.agents) == sorted(AGENT_TYPES) and cc.tools == ("Agent",)
    cx = codex.setup_for(specs["codex"].task, specs["codex"].harness.codex)
    assert "spawn_agent" in cx.instructions and specs["codex"].harness.codex.subagents
    oc = opencode.setup_for(specs["opencode"].task, specs["opencode"].harness.opencode)
    assert oc.default_agent == LEAD and oc.agents[LEAD]["tools"] == {"*": False, "task": True}
    assert {a for a, body in oc.agents.items() if body.get("mode") == "subagent"} == set(AGENT_TYPES)
    for name, setup in (("claude-code", cc), ("codex", cx), ("opencode", oc)):
        words = specs[name].task.params["words"]
        assert words[0] not in ("cat", "dog") and words[1] in setup.message  # made-up words
        assert "fact-finder" in setup.message and "condenser" in setup.message and words[0] in setup.message
