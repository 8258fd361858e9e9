"""The held-out tool-call figures' scoring (models/tool_eval.py) on hand-written replies, and one run of
the whole script on the random tiny model."""

from __future__ import annotations

import json

from models.tool_drills import harness_requests
from models.tool_eval import evaluate, lead_request, resume_request, score_lead, score_resume, score_worker

WORDS = ["glorpin", "brastek"]


def call(prompt: str, name: str = "task", agent: str = "worker") -> str:
    args = {"description": "Answer", "prompt": prompt, "subagent_type": agent}
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_a_reply_with_two_task_calls_copying_both_words_scores_full():
    body = lead_request(WORDS)
    assert body["messages"][1]["content"] == '"Words: glorpin brastek"'
    assert body["tools"] == harness_requests()["lead_first"]["tools"]
    reply = call("Reply with the word glorpin.") + "\n" + call("Reply with the word brastek.")
    assert score_lead(reply, body, WORDS) == {
        "well_formed": 1.0, "two_task_calls": 1.0, "word_copied": 1.0, "both_copied": 1.0,
    }  # fmt: skip


def test_wrong_tools_words_or_json_lose_exactly_their_points():
    body = lead_request(WORDS)
    one_word = call("Reply with the word glorpin.") + "\n" + call("Reply with the word glorp.")
    assert score_lead(one_word, body, WORDS)["word_copied"] == 0.5
    assert score_lead(one_word, body, WORDS)["both_copied"] == 0.0
    unknown_tool = call("glorpin", name="bash") + call("brastek")
    assert score_lead(unknown_tool, body, WORDS)["well_formed"] == 0.0
    missing_arg = '<tool_call>{"name": "task", "arguments": {"prompt": "glorpin"}}</tool_call>'
    assert score_lead(missing_arg, body, WORDS)["well_formed"] == 0.0
    assert (
        score_lead('<tool_call>{"name": "task", "arguments": {</tool_call>', body, WORDS)["well_formed"]
        == 0.0
    )
    assert score_lead("glorpin brastek", body, WORDS)["well_formed"] == 0.0
    wrong_agent = call("glorpin", agent="explore") + call("brastek")
    assert score_lead(wrong_agent, body, WORDS)["two_task_calls"] == 0.0


def test_worker_and_resume_scores():
    assert score_worker("glorpin", "glorpin")["exact"] == score_worker(" glorpin.", "glorpin")["exact"] == 1.0
    assert score_worker("The word is glorpin.", "glorpin")["exact"] == 0.0
    assert score_resume("brastek, glorpin", WORDS)["both_words"] == 1.0
    assert score_resume("glorpin", WORDS)["both_words"] == 0.0


def test_resume_request_carries_the_new_words_everywhere():
    text = json.dumps(resume_request(WORDS))
    assert "zorblat" not in text and "quintessa" not in text
    tool_results = [m["content"] for m in resume_request(WORDS)["messages"] if m["role"] == "tool"]
    assert ["<task_result>\nglorpin\n</task_result>" in tool_results[0], "brastek" in tool_results[1]] == [
        True,
        True,
    ]


def test_the_script_runs_end_to_end_on_held_out_words(tiny_model_dir):
    report = evaluate(str(tiny_model_dir), trials=1)
    assert set(report.greedy) == set(report.t07) == {"lead", "worker", "resume"}
    assert set(report.greedy["lead"].scores) == {
        "well_formed",
        "two_task_calls",
        "word_copied",
        "both_copied",
    }
    assert all(
        0.0 <= v <= 1.0
        for kinds in (report.greedy, report.t07)
        for k in kinds.values()
        for v in k.scores.values()
    )
    assert report.prompt_tokens["default_first"] > 10_000  # OpenCode's default agent in the tiny tokenizer
