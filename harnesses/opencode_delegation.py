"""The `opencode-delegation` task family: stock OpenCode, a restricted lead hands one word to each of two
subagents through two concurrent `task` calls, the subagents answer, the lead resumes and answers.

What the harness runner needs to run an episode of it:

- `OPENCODE_AGENTS` / `DEFAULT_AGENT`: the `agent` section of the episode's `opencode.json`: a primary
  `lead` with only the `task` tool and a `worker` subagent with no tools; OpenCode's own `explore` and
  `general` subagents and the title call are disabled, so the lead's first request is ~1,000 tokens in
  the tiny-tools tokenizer (~1,900 in tiny's).
- `user_message(task)`: the prompt given to `opencode run` (it arrives quoted, `"Words: w1 w2"`).

The prompts are those the tiny-tools model was drilled on (models/tool_drills.py), with OpenCode's
real request text around them (models/harness_text/).

harnesses/opencode.py registers it in `TASK_SETUPS`, so the harness runner configures episodes with it.

Reward, shaped as `delegation`'s: 0.5 x the workers' mean similarity to their words + 0.5 x how closely
the lead's final answer reads the two words back (`read_back_score`: partial credit for a near-miss copy,
extra words dilute it). Not the exact fraction of the two words present: that pays the lead nothing
in simulated episodes of tiny-copy and tiny-resume (docs/results.md section 2.2), so half the reward
has no spread and GRPO nothing to move the lead's final turn with. A fixed answer, or another
task's two words, earns little (the words are made up afresh per task); a near-miss copy most of the
credit.

Workers are the outcome's agents of the `worker` type: `worker`, `worker-2` (the runner and the gateway
name OpenCode's subagents after their type, numbered in the lead's call order; harnesses/
opencode_agents.py), or any other `worker-...` (a simulation's `worker-1`, an unmatched session's
`worker-ses_...`); which one was handed which word is not in the outcome, so the worker slots are
filled by the assignment of workers to words that scores best (two workers: two assignments). A worker
that answers the other worker's word therefore scores as if it had been handed that word; two workers
answering the same word score once. Missing workers score 0. Tasks are a pure function of their index.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses.delegation import similarity
from models.tool_drills import LEAD_PROMPT, WORKER_PROMPT, draw_words

FAMILY = "opencode-delegation"
WORKER_TYPE = "worker"  # the family's subagent type: its subagents are `worker`, `worker-2`, ...
DEFAULT_AGENT = "lead"
OPENCODE_AGENTS: dict[str, dict] = {
    "lead": {"mode": "primary", "prompt": LEAD_PROMPT, "tools": {"*": False, "task": True}},
    "worker": {
        "mode": "subagent",
        "description": "Repeats the word it is given.",
        "prompt": WORKER_PROMPT,
        "tools": {"*": False},
    },
    "explore": {"disable": True},
    "general": {"disable": True},
    "title": {"disable": True},
}


def make_task(index: int, family: str = FAMILY) -> TaskSpec:
    """Task `index` of `family` (this one, or one that shares its words: opencode-reader): two distinct
    made-up words drawn under the family's name (from the drills' training side of the split, none of the
    few common words the drills also use)."""
    words = draw_words(random.Random(f"{family}-{index}"), 2, common_share=0.0)
    return TaskSpec(family=family, task_id=f"{family}-{index}", params={"words": words})


def user_message(task: TaskSpec) -> str:
    return "Words: " + " ".join(task.params["words"])


def worker_answers(outcome: HarnessOutcome) -> list[str]:
    """The last answer of each `worker` subagent, in the order the outcome lists them."""
    return [texts[-1] for agent, texts in outcome.outputs.items() if is_worker(agent) and texts]


def is_worker(agent: str) -> bool:
    return agent == WORKER_TYPE or agent.startswith(f"{WORKER_TYPE}-")


def best_assignment(
    answers: list[str], words: list[str], credit: Callable[[str, str], float] = similarity
) -> list[float]:
    """Per word, the `credit` of the worker assigned to it, under the assignment that scores best (a word
    no worker is assigned to scores 0)."""
    padded = answers + [""] * max(0, len(words) - len(answers))
    best = [0.0] * len(words)
    for chosen in itertools.permutations(padded, len(words)):
        scores = [credit(a, w) if a else 0.0 for a, w in zip(chosen, words, strict=True)]
        if sum(scores) > sum(best):
            best = scores
    return best


def read_back_score(final_answer: str, words: list[str]) -> float:
    """How closely the answer's runs of letters read `words` back, in [0, 1]: the similarity of each word
    to the run assigned to it (the assignment that scores best, a run used once), summed, over the number
    of runs or of words, whichever is more. Both words and nothing else: 1 (any order, any separator);
    one word alone: 0.5; a near-miss copy earns its similarity; every extra run dilutes, so a sentence
    around the words or a list of guesses earns less than the words alone."""
    runs = re.findall(r"[a-z]+", final_answer.lower())
    if not runs:
        return 0.0
    return sum(best_assignment(runs, words)) / max(len(runs), len(words))


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    words: list[str] = task.params["words"]
    workers = best_assignment(worker_answers(outcome), words)
    parent = read_back_score(outcome.final_answer, words)
    worker_mean = sum(workers) / len(workers)
    return RewardResult(
        reward=0.5 * worker_mean + 0.5 * parent, details={"workers": worker_mean, "parent": parent}
    )
