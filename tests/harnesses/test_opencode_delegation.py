"""The opencode-delegation family: tasks, OpenCode's `worker-ses_...` subagents mapped to the reward's
worker slots, and the agents its episodes configure."""

from __future__ import annotations

import pytest

from grove.contracts import HarnessOutcome
from harnesses.opencode_delegation import (
    DEFAULT_AGENT,
    FAMILY,
    OPENCODE_AGENTS,
    make_task,
    read_back_score,
    score,
    user_message,
)
from harnesses.programs import family
from models.tool_drills import harness_requests

A, B = "ses_dcece9cdeffeW1lpdLszecT6AB", "ses_dcece9c52ffeikIH177Hv0454p"  # real OpenCode session ids


def test_tasks_are_a_pure_function_of_the_index_with_two_distinct_words():
    assert family(FAMILY)[0] is make_task
    tasks = [make_task(i) for i in range(50)]
    assert tasks == [make_task(i) for i in range(50)]
    assert all(len(set(t.params["words"])) == 2 for t in tasks)
    assert len({tuple(t.params["words"]) for t in tasks}) == 50
    assert user_message(tasks[0]) == "Words: " + " ".join(tasks[0].params["words"])


@pytest.mark.parametrize("order", ["spawn order", "reversed"])
def test_subagent_sessions_fill_the_worker_slots_whatever_their_order(order):
    task = make_task(3)
    w1, w2 = task.params["words"]
    outputs = {"parent": ["", f"{w1} {w2}"], f"worker-{A}": [w1], f"worker-{B}": [w2]}
    if order == "reversed":
        outputs = dict(reversed(list(outputs.items())))
    result = score(task, HarnessOutcome(final_answer=f"{w1} {w2}", outputs=outputs))
    assert result.reward == 1.0 and result.details == {"workers": 1.0, "parent": 1.0}


def test_partial_and_missing_answers_score_partially():
    task = make_task(4)
    w1, w2 = task.params["words"]
    one_worker = HarnessOutcome(final_answer=w1, outputs={f"worker-{A}": [f"{w2}."]})
    result = score(task, one_worker)
    assert result.details["parent"] == 0.5
    assert 0.45 < result.details["workers"] < 0.5  # "w2." is close to w2; the missing worker scores 0
    same_word = HarnessOutcome(final_answer="", outputs={f"worker-{A}": [w1], f"worker-{B}": [w1]})
    assert score(task, same_word).details["workers"] < 1.0  # one word answered twice is not both
    assert score(task, HarnessOutcome()).reward == 0.0


def test_the_leads_read_back_earns_partial_credit_and_extra_words_dilute_it():
    words = ["weallyrnplou", "cloostfraimdrea"]  # held-out made-up words of the drills' kind
    assert read_back_score("cloostfraimdrea, weallyrnplou.", words) == 1.0  # any order and separator
    # tiny-resume's final answer in a simulated episode: two near-miss copies (difflib ratios 14/21, 26/28)
    assert read_back_score("weegnplou\noostfraimdrea", words) == pytest.approx((14 / 21 + 26 / 28) / 2)
    assert read_back_score("The words are weallyrnplou and cloostfraimdrea", words) == pytest.approx(2 / 6)
    assert read_back_score("", words) == read_back_score("42!", words) == 0.0


def test_no_fixed_answer_reads_back_the_words_of_most_tasks():
    tasks = [make_task(i) for i in range(200)]
    copies = sum(read_back_score(" ".join(t.params["words"])[:-1], t.params["words"]) for t in tasks)
    # a fixed answer, or the two words of another task, is scored on words it never saw
    for fixed in ("worker", "the words", tasks[0].params["words"][0]):
        assert sum(read_back_score(fixed, t.params["words"]) for t in tasks[1:]) < 0.3 * copies
    others = sum(
        read_back_score(" ".join(tasks[i - 1].params["words"]), t.params["words"])
        for i, t in enumerate(tasks)
    )
    assert others < 0.35 * copies


def test_agents_are_the_restricted_lead_and_a_toolless_worker_of_the_captured_traffic():
    assert OPENCODE_AGENTS[DEFAULT_AGENT]["tools"] == {"*": False, "task": True}
    assert OPENCODE_AGENTS["worker"]["tools"] == {"*": False}
    captured = harness_requests()
    # the prompts the model was drilled on are the ones OpenCode put in front of its environment block
    assert captured["lead_first"]["messages"][0]["content"].startswith(OPENCODE_AGENTS["lead"]["prompt"])
    assert captured["worker_first"]["messages"][0]["content"].startswith(OPENCODE_AGENTS["worker"]["prompt"])
    assert [t["function"]["name"] for t in captured["lead_first"]["tools"]] == ["task"]


def test_the_harness_runner_sets_episodes_up_with_the_familys_agents_and_message():
    from grove.contracts import OpenCodeOptions
    from harnesses.opencode import setup_for  # the runner's own setup lookup

    task = make_task(7)
    setup = setup_for(task, OpenCodeOptions())
    assert setup.message == user_message(task) and setup.agents == OPENCODE_AGENTS
    assert setup.default_agent == DEFAULT_AGENT


def test_the_runners_numbered_workers_score_like_session_named_ones():
    task = make_task(8)
    w1, w2 = task.params["words"]
    numbered = HarnessOutcome(final_answer=f"{w2} {w1}", outputs={"worker-1": [w2], "worker-2": [w1]})
    assert score(task, numbered).reward == 1.0
