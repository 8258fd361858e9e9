"""The `summary-delegation` task family: delegation where each worker's context is compacted by its own
summary call before it answers, so what the summary keeps decides the worker's answer and the lead's.

    lead     [system, user "Words:\\n<w1>\\n<w2>"]                   -> the delegating reply (spawns both)
    worker i [system, user "Word:\\n<wi>\\nOther:\\n<di>"]             its fact and a distractor
             + user "Summary:"                                  -> its summary call (kind SUMMARY)
             rewrite: [system, user "Summary:\\n<summary>"] + user "Word?" -> its answer
    lead     + the workers' answers as tool results             -> the final answer

After the rewrite the worker's context holds only its system prompt and its summary: the word reaches
its answer, and through it the lead's, only if the summary kept it (and not the distractor).

Reward (fixed before any run of the family; docs/results.md):

    reward = 0.25 * summary + 0.25 * workers + 0.5 * parent
    summary = mean over workers of word_score(its summary, its word)
    workers = mean over workers of word_score(its answer, its word)
    parent  = named_score(the lead's final answer, both words)

`word_score` and `named_score` are the delegation family's (harnesses/delegation.py): task-dependent
credit, so no fixed text earns more than half on average, and naming extra vocabulary words costs the
lead. The summary component is the summary's own share; the other three quarters are its consequences.
Words sit on lines of their own, as in `delegation`, so that copying is copying tokens.
"""

from __future__ import annotations

import asyncio

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses.delegation import named_score, parent_prompt, word_score
from harnesses.delegation_words import PARENT_SYSTEM, WORDS, task_words
from harnesses.native import Agent, NativeEpisode, system, tool_result, user

FAMILY = "summary-delegation"
WORKER_SYSTEM = "You are a worker. Keep your word, drop the other one."
SUMMARY_INSTRUCTION = "Summary:"
SUMMARY_TEMPLATE = "Summary:\n{}"
ASK = "Word?"
DISTRACTOR_OFFSET = 5  # distractors: the words from WORDS[first word + 5] on that the task does not name


def distractors(words: list[str]) -> list[str]:
    """One distractor per worker: vocabulary words not in the task, distinct, a pure function of it."""
    start = WORDS.index(words[0]) + DISTRACTOR_OFFSET
    out: list[str] = []
    k = 0
    while len(out) < len(words):
        candidate = WORDS[(start + k) % len(WORDS)]
        if candidate not in words and candidate not in out:
            out.append(candidate)
        k += 1
    return out


def worker_prompt(word: str, distractor: str) -> dict:
    return user(f"Word:\n{word}\nOther:\n{distractor}")


def make_task(index: int) -> TaskSpec:
    words = task_words(index)
    return TaskSpec(
        family=FAMILY,
        task_id=f"{FAMILY}-{index}",
        params={"words": words, "distractors": distractors(words)},
    )


async def _work(worker: Agent) -> str:
    """The worker's own summary call replaces its context (keeping its system prompt), then it answers."""
    await worker.compact(SUMMARY_INSTRUCTION, keep=1, template=SUMMARY_TEMPLATE)
    return (await worker.reply(user(ASK))).text


async def program(episode: NativeEpisode) -> str:
    params = episode.spec.task.params
    words, others = params["words"], params["distractors"]
    lead = await episode.root("parent", [system(PARENT_SYSTEM), parent_prompt(words)])
    await lead.reply()  # the delegating turn: the workers are spawned by this call
    workers = [
        await episode.spawn(
            f"worker-{i + 1}", by=lead, messages=[system(WORKER_SYSTEM), worker_prompt(word, other)]
        )
        for i, (word, other) in enumerate(zip(words, others, strict=True))
    ]
    answers = await asyncio.gather(*(_work(w) for w in workers))
    final = await lead.reply(*(tool_result(a) for a in answers))
    return final.text


def _last(outcome: HarnessOutcome, agent: str) -> str | None:
    texts = outcome.outputs.get(agent, [])
    return texts[-1] if texts else None


def _mean_score(texts: list[str | None], words: list[str]) -> float:
    """word_score per worker; a worker with no text scores 0 (it never answered or never summarised)."""
    scores = [word_score(t, w) if t is not None else 0.0 for t, w in zip(texts, words, strict=True)]
    return sum(scores) / len(scores)


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    words: list[str] = task.params["words"]
    agents = [f"worker-{i + 1}" for i in range(len(words))]
    summary = _mean_score([_last(outcome, f"{a}~summary") for a in agents], words)
    workers = _mean_score([_last(outcome, a) for a in agents], words)
    parent = named_score(outcome.final_answer, words)
    return RewardResult(
        reward=0.25 * summary + 0.25 * workers + 0.5 * parent,
        details={"summary": summary, "workers": workers, "parent": parent},
    )
