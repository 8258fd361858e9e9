"""The `delegation` task family: tasks, prompts and the reward (expected values computed by hand)."""

from __future__ import annotations

import pytest

from grove.contracts import HarnessOutcome
from harnesses.delegation import make_task, parent_prompt, score, similarity, worker_prompt


def outcome(final: str, w1: list[str] | None = None, w2: list[str] | None = None) -> HarnessOutcome:
    outputs = {"parent": ["delegating", final]}
    if w1 is not None:
        outputs["worker-1"] = w1
    if w2 is not None:
        outputs["worker-2"] = w2
    return HarnessOutcome(final_answer=final, outputs=outputs)


@pytest.mark.parametrize(
    ("answer", "word", "expected"),
    [
        ("snow", "snow", 1.0),
        ("  SNOW \n", "snow", 1.0),  # stripped, lower-cased
        ("Snow.\nand more", "snow", 8 / 9),  # first line only: 2*4 matched / (5 + 4)
        ("The word is snow.", "snow", 8 / 21),  # 2*4 / (17 + 4): brevity counts
        ("bo", "book", 2 / 3),  # 2*2 / (2 + 4)
        ("", "snow", 0.0),
        ("xyz", "snow", 0.0),
    ],
)
def test_similarity_is_difflib_ratio_of_the_first_line(answer, word, expected):
    assert similarity(answer, word) == pytest.approx(expected)


def test_reward_mixes_workers_and_parent_half_and_half():
    task = make_task(0)  # red, blue
    r = score(task, outcome("red", ["red"], ["bl"]))
    # workers: (1 + 2*2/(2+4)) / 2 = 5/6; parent: 1 of 2 words -> 1/2; reward 0.5*5/6 + 0.5*1/2 = 2/3
    assert r.details == pytest.approx({"workers": 5 / 6, "parent": 0.5})
    assert r.reward == pytest.approx(2 / 3)


def test_parent_gets_full_credit_for_both_words_in_any_case_and_punctuation():
    task = make_task(0)
    r = score(task, outcome("Blue, RED.", ["The word is red."], ["blue\nblue"]))
    # workers: (2*3/(16+3) + 1) / 2 = (6/19 + 1) / 2 = 25/38; parent 1; reward 25/76 + 1/2 = 63/76
    assert r.details == pytest.approx({"workers": 25 / 38, "parent": 1.0})
    assert r.reward == pytest.approx(63 / 76)


def test_words_glued_together_or_missing_workers_score_zero():
    task = make_task(0)
    r = score(task, outcome("redblue"))  # no worker output at all, and no separate word
    assert r.reward == 0.0 and r.details == {"workers": 0.0, "parent": 0.0}


def test_a_worker_is_scored_on_its_last_answer():
    task = make_task(0)
    r = score(task, outcome("", ["nonsense", "red"], ["blue"]))
    assert r.details["workers"] == 1.0 and r.reward == 0.5


def test_tasks_are_distinct_ordered_pairs_of_distinct_words():
    assert make_task(0).params["words"] == ["red", "blue"]
    assert make_task(16).params["words"] == ["red", "green"]  # second = (0 + 1 + 1) % 16
    assert make_task(17).params["words"] == ["blue", "cat"]
    pairs = [tuple(make_task(i).params["words"]) for i in range(16 * 15)]
    assert len(set(pairs)) == 240 and all(a != b for a, b in pairs)
    assert make_task(5) == make_task(5)


def test_prompts_put_each_word_on_a_line_of_its_own():
    assert worker_prompt("snow") == {"role": "user", "content": "Word:\nsnow"}
    assert parent_prompt(["snow", "book"]) == {"role": "user", "content": "Words:\nsnow\nbook"}
