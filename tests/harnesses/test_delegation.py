"""The `delegation` task family: tasks, prompts and the reward (expected values computed by hand)."""

from __future__ import annotations

import pytest

from grove.contracts import HarnessOutcome
from harnesses.delegation import (
    WORDS,
    make_task,
    named_score,
    parent_prompt,
    score,
    similarity,
    word_score,
    worker_prompt,
)


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


# ---------------------------------------------- the constant-proof credit of the framework families


@pytest.mark.parametrize("answer", [*WORDS, "sand", "The word is snow.", "xyz", "sno"])
def test_no_fixed_answer_earns_more_than_half_on_average_over_the_words(answer):
    """A fixed answer scores the same whatever the task: its mean over the words the tasks draw is what
    GRPO can raise by learning it everywhere. `word_score` pays any fixed answer ~0.5 on average."""
    mean = sum(word_score(answer, w) for w in WORDS) / len(WORDS)
    assert abs(mean - 0.5) < 0.02


def test_plain_similarity_pays_one_constant_more_than_another():
    """Why the framework families do not use `similarity`: it pays "sand" on every task, "xyz" on none."""
    mean = {a: sum(similarity(a, w) for w in WORDS) / len(WORDS) for a in ("sand", "xyz")}
    assert mean["xyz"] == 0.0 and mean["sand"] > 0.25


def test_the_word_scores_one_and_a_near_copy_more_than_any_fixed_answer():
    assert word_score("snow", "snow") == 1.0 and word_score("Snow.\nmore", "snow") > 0.9
    assert 0.85 < word_score("sno", "snow") < 1.0
    assert word_score("sand", "door") < 0.5 < word_score("doo", "door")


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        ("Red, BLUE.", 1.0),
        ("red", 0.5),
        ("red green", 0.0),  # one word right, one other vocabulary word named: no credit
        ("red blue green", 0.5),
        ("red blue sand", 1.0),  # "sand" is no word of the vocabulary
        (" ".join(WORDS), 0.0),  # naming every word earns nothing
    ],
)
def test_the_parent_is_paid_for_its_words_less_the_other_words_it_names(final, expected):
    assert named_score(final, ["red", "blue"]) == expected
