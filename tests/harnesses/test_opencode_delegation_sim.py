"""Simulated opencode-delegation episodes (harnesses/opencode_delegation_sim.py): the requests chain as
OpenCode chains them, and the family's reward scores the outcome; a scripted model stands in."""

from __future__ import annotations

import json

from grove.contracts import TaskSpec
from harnesses.opencode_delegation import FAMILY, score
from harnesses.opencode_delegation_sim import play_episode

WORDS = ["glorpin", "brastek"]


def call(prompt: str, name: str = "task", agent: str = "worker") -> str:
    args = {"description": "Answer", "prompt": prompt, "subagent_type": agent}
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


class ScriptedReplies:
    """Stands in for the model in the episode chaining: answers each request by its kind and records it."""

    def __init__(self, lead: str, final: str) -> None:
        self.lead, self.final, self.requests = lead, final, []

    def reply(self, body, *, temperature, seed, max_new_tokens):
        self.requests.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return self.final
        if body.get("tools"):
            return self.lead
        return last["content"].split()[-1].rstrip(".")  # a worker repeating the last word it was given


def test_a_simulated_episode_chains_the_requests_as_opencode_does():
    gen = ScriptedReplies(
        call("Reply with the word glorpin.") + "\n" + call("Say brastek"), "glorpin brastek"
    )
    outcome = play_episode(gen, WORDS, temperature=0.7, seed=0)
    _, w1, w2, resume = gen.requests
    assert [m["content"] for m in (w1["messages"][1], w2["messages"][1])] == [
        "Reply with the word glorpin.", "Say brastek",
    ]  # fmt: skip
    calls = resume["messages"][2]["tool_calls"]
    assert json.loads(calls[1]["function"]["arguments"])["prompt"] == "Say brastek"
    assert ", " not in calls[1]["function"]["arguments"]  # compact JSON, as OpenCode re-sends it
    results = [m["content"] for m in resume["messages"][3:]]
    assert ["<task_result>\nglorpin\n" in results[0], "<task_result>\nbrastek\n" in results[1]] == [
        True,
        True,
    ]
    assert outcome.outputs["worker-1"] == ["glorpin"] and outcome.final_answer == "glorpin brastek"
    task = TaskSpec(family=FAMILY, task_id="t", params={"words": WORDS})
    assert score(task, outcome).reward == 1.0


def test_a_lead_without_tool_calls_ends_the_simulated_episode():
    gen = ScriptedReplies("glorpin", "unused")
    outcome = play_episode(gen, WORDS, temperature=0.7, seed=0)
    assert len(gen.requests) == 1 and outcome.final_answer == "glorpin"
    assert [k for k in outcome.outputs if k.startswith("worker-")] == []
