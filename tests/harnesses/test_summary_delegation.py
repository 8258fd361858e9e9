"""The `summary-delegation` family's tasks and reward, on texts written out by hand (pure)."""

from __future__ import annotations

from grove.contracts import HarnessOutcome
from harnesses.delegation_words import WORDS
from harnesses.summary_delegation import make_task, score


def outcome(summaries: list[str] | None, answers: list[str], final: str) -> HarnessOutcome:
    outputs = {f"worker-{i + 1}": [a] for i, a in enumerate(answers)}
    for i, s in enumerate(summaries or []):
        outputs[f"worker-{i + 1}~summary"] = [s]
    return HarnessOutcome(final_answer=final, outputs={"parent": ["x", final], **outputs})


def test_task_zero_gives_each_worker_its_word_and_a_distractor_the_task_does_not_name():
    task = make_task(0)
    assert task.params == {"words": ["red", "blue"], "distractors": ["sun", "moon"]}
    for index in range(len(WORDS) * (len(WORDS) - 1)):  # every ordered pair of the vocabulary
        params = make_task(index).params
        words, others = params["words"], params["distractors"]
        assert len(set(words + others)) == 4 and set(others) <= set(WORDS), params


def test_summaries_that_kept_the_words_earn_everything():
    got = score(make_task(0), outcome(["red", "blue"], ["red", "blue"], "red blue"))
    assert got.reward == 1.0 and got.details == {"summary": 1.0, "workers": 1.0, "parent": 1.0}


def test_a_summary_that_kept_the_distractor_loses_its_share_and_its_consequences():
    kept = score(make_task(0), outcome(["red", "blue"], ["red", "blue"], "red blue")).reward
    lost = score(make_task(0), outcome(["sun", "moon"], ["sun", "moon"], "sun moon"))
    assert lost.details["parent"] == 0.0  # the lead named two words the task did not give
    assert lost.details["summary"] < 0.5 and lost.details["workers"] < 0.5  # below any fixed answer's mean
    assert lost.reward < 0.25 < kept


def test_the_summary_is_a_quarter_of_the_reward_and_a_missing_one_scores_zero():
    with_summary = score(make_task(0), outcome(["red", "blue"], ["red", "blue"], "red blue"))
    without = score(make_task(0), outcome(None, ["red", "blue"], "red blue"))
    assert without.details["summary"] == 0.0
    assert with_summary.reward - without.reward == 0.25
