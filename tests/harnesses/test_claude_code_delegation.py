"""The claude-code-delegation family: tasks, its reward (the lead's half counts only for words a worker
answered), and the custom agents its episodes pass with `--agents`."""

from __future__ import annotations

import pytest

from grove.contracts import HarnessOutcome
from harnesses.claude_code_delegation import (
    AGENTS,
    FAMILY,
    LEAD_TOOLS,
    WORKER_TYPE,
    make_task,
    score,
    user_message,
)
from harnesses.programs import family


def test_tasks_are_a_pure_function_of_the_index_with_two_distinct_words():
    assert family(FAMILY)[0] is make_task and family(FAMILY)[1] is score
    tasks = [make_task(i) for i in range(40)]
    assert tasks == [make_task(i) for i in range(40)]
    assert all(len(set(t.params["words"])) == 2 and t.family == FAMILY for t in tasks)
    assert len({tuple(t.params["words"]) for t in tasks}) == 40
    w1, w2 = tasks[0].params["words"]
    assert user_message(tasks[0]) == f"Words: {w1} {w2}"


def test_both_workers_and_the_read_back_earn_the_whole_reward_in_any_order():
    task = make_task(2)
    w1, w2 = task.params["words"]
    outcome = HarnessOutcome(final_answer=f"{w2}, {w1}", outputs={"worker": [w2], "worker-2": [w1]})
    result = score(task, outcome)
    assert result.reward == 1.0
    assert result.details == {"workers": 1.0, "parent": 1.0, "delegated": 1.0}


def test_a_lead_that_answers_without_its_subagents_earns_nothing():
    task = make_task(5)
    w1, w2 = task.params["words"]
    alone = score(task, HarnessOutcome(final_answer=f"{w1} {w2}", outputs={"parent": [f"{w1} {w2}"]}))
    assert alone.details["parent"] == 1.0  # a perfect read-back...
    assert alone.reward == 0.0  # ...pays nothing without workers


def test_one_worker_caps_the_leads_half_at_a_half():
    task = make_task(7)
    w1, w2 = task.params["words"]
    result = score(task, HarnessOutcome(final_answer=f"{w1} {w2}", outputs={"worker": [w1]}))
    assert result.details == {"workers": 0.5, "parent": 1.0, "delegated": 0.5}
    assert result.reward == pytest.approx(0.5 * 0.5 + 0.5 * 1.0 * 0.5)
    empty = score(task, HarnessOutcome(final_answer=f"{w1} {w2}", outputs={"worker": [" "]}))
    assert empty.details["delegated"] == 0.0 and empty.reward == 0.0  # a blank report is no answer
    assert score(task, HarnessOutcome()).reward == 0.0


def test_the_worker_is_a_custom_agent_without_tools_and_the_lead_has_only_agent():
    assert LEAD_TOOLS == ("Agent",)
    worker = AGENTS[WORKER_TYPE]
    assert set(worker) == {"description", "prompt", "tools"} and worker["tools"] == []
