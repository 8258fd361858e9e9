"""The `delegation` task family: a parent hands one word to each of two workers, then reports both.

The reward depends on the workers *and* the parent: each worker should repeat its word, and the
parent's final answer should contain both words (it sees the workers' answers as tool results).

    reward = 0.5 * mean over workers of similarity(worker answer, its word)
           + 0.5 * fraction of the two words present in the parent's final answer

`similarity` is difflib's ratio of the answer's first line (stripped, lower-cased) to the word:
partial credit, so a tiny model gets a gradient from the start, and brevity counts ("snow" scores 1,
"snow." 0.89, "The word is snow." 0.38). A word is "present" in the parent's answer when it is one of
the answer's lower-cased runs of letters ("Snow, book." has both; "snowbook" has neither). Tasks are
a pure function of their index; the reward is a pure function of the texts.

Prompts put each word on a line of its own ("Word:\nsnow"), where a byte-level BPE tokenizer encodes
it exactly as at the start of an answer (no leading space): repeating it is then copying tokens, not
also mapping " snow" to "snow", which the tiny model cannot do (docs: models/tiny.py on copying).
"""

from __future__ import annotations

import asyncio
import difflib
import re

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses.delegation_words import FAMILY, PARENT_SYSTEM, WORDS, WORKER_SYSTEM, task_words
from harnesses.native import Message, NativeEpisode, system, tool_result, user


def worker_prompt(word: str) -> Message:
    return user(f"Word:\n{word}")


def parent_prompt(words: list[str]) -> Message:
    return user("Words:\n" + "\n".join(words))


def make_task(index: int) -> TaskSpec:
    """Task `index` of the family: an ordered pair of distinct words."""
    return TaskSpec(family=FAMILY, task_id=f"{FAMILY}-{index}", params={"words": task_words(index)})


async def program(episode: NativeEpisode) -> str:
    words = episode.spec.task.params["words"]
    parent = await episode.root("parent", [system(PARENT_SYSTEM), parent_prompt(words)])
    await parent.reply()  # the delegating turn; the workers are spawned by this call
    workers = [
        await episode.spawn(f"worker-{i + 1}", by=parent, messages=[system(WORKER_SYSTEM), worker_prompt(w)])
        for i, w in enumerate(words)
    ]
    answers = await asyncio.gather(*(w.reply() for w in workers))
    final = await parent.reply(*(tool_result(a.text) for a in answers))
    return final.text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip().lower() if text.strip() else ""


def similarity(answer: str, word: str) -> float:
    return difflib.SequenceMatcher(None, _first_line(answer), word).ratio()


def _mean_other(answer: str, word: str, vocabulary: tuple[str, ...]) -> float:
    others = [v for v in vocabulary if v != word]
    return sum(similarity(answer, v) for v in others) / len(others)


def word_score(answer: str, word: str, vocabulary: tuple[str, ...] = WORDS) -> float:
    """A worker's answer scored on how much better it matches its own word than the vocabulary's others,
    in [0, 1]: 1 for the word itself, 0.5 for an answer that matches its word no better than the rest.

    Plain `similarity` pays some wrong answers on every task ("sand" earns 0.26 on average over WORDS,
    "xyz" 0), so GRPO can raise the reward by learning one constant word instead of copying (a
    LangGraph run does: every agent comes to answer "sand"). Here the credit is the similarity to the
    word minus the mean similarity to the other words, divided by that margin for the word itself
    (so the word scores 1); over tasks that draw each word equally often, any fixed answer's credit
    averages ~0 (within 0.02 over WORDS), so only answers that depend on the task can gain.
    """
    credit = (similarity(answer, word) - _mean_other(answer, word, vocabulary)) / (
        1.0 - _mean_other(word, word, vocabulary)
    )
    return (1.0 + max(-1.0, min(1.0, credit))) / 2.0


def named_score(final_answer: str, words: list[str], vocabulary: tuple[str, ...] = WORDS) -> float:
    """The fraction of `words` the answer names, less one per other vocabulary word it names (>= 0):
    naming every word of the vocabulary earns nothing."""
    said = set(re.findall(r"[a-z]+", final_answer.lower()))
    extra = len((said & set(vocabulary)) - set(words))
    return max(0, sum(w in said for w in words) - extra) / len(words)


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    words: list[str] = task.params["words"]
    worker_scores = []
    for i, word in enumerate(words):
        texts = outcome.outputs.get(f"worker-{i + 1}", [])
        worker_scores.append(similarity(texts[-1], word) if texts else 0.0)
    said = set(re.findall(r"[a-z]+", outcome.final_answer.lower()))
    parent_score = sum(w in said for w in words) / len(words)
    worker_mean = sum(worker_scores) / len(worker_scores)
    return RewardResult(
        reward=0.5 * worker_mean + 0.5 * parent_score,
        details={"workers": worker_mean, "parent": parent_score},
    )
