"""The `claude-code-delegation` task family: stock Claude Code, a lead whose only tool is `Agent` hands
one word to each of two `worker` subagents (custom agents passed with `--agents`), the workers answer,
the lead answers with both words.

What the harness runner needs to run an episode of it (harnesses/claude_code.py registers it in
`TASK_SETUPS`):

- `LEAD_PROMPT`: the lead's `--system-prompt`; `LEAD_TOOLS`: its built-in tools (`--tools Agent`: the
  `Agent` tool alone keeps the lead's first request near 7.5k characters);
- `AGENTS`: the `--agents` JSON: one custom subagent `worker` with no tools (its request ~3.3k
  characters); Claude Code's built-in subagents are switched off by the runner's environment;
- `user_message(task)`: the first user message, `Words: w1 w2`.

Reward: the lead must use its subagents. 0.5 x the workers' mean similarity to their words (workers are
the outcome's `worker`, `worker-2`, ... slots, filled by the assignment of answers to words that scores
best: harnesses/opencode_delegation.best_assignment) + 0.5 x how closely the lead's final answer reads
the two words back (`read_back_score`: partial credit for a near-miss copy, extra words dilute it) x
the share of the two words a worker answered at all (workers with a non-empty answer, at most two). A
lead that answers the words itself without starting workers therefore earns 0 (the words are in its
prompt, so without that factor the lead's half would pay for skipping the subagents); one worker caps
the lead's half at a half. Tasks are a pure function of their index: two made-up words drawn under
the family's name.
"""

from __future__ import annotations

import random

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses.opencode_delegation import best_assignment, read_back_score, worker_answers
from models.tool_drills import draw_words

FAMILY = "claude-code-delegation"
WORKER_TYPE = "worker"
LEAD_PROMPT = (
    "You are the lead. Give each word the user lists to its own worker with the Agent tool "
    "(subagent_type worker, the word as the prompt, run_in_background false), all at once. When the "
    "workers answer, reply with their words."
)
WORKER_PROMPT = "You are a worker. Reply with the word you are given."
LEAD_TOOLS: tuple[str, ...] = ("Agent",)
AGENTS: dict[str, dict] = {
    WORKER_TYPE: {"description": "Repeats the word it is given.", "prompt": WORKER_PROMPT, "tools": []},
}


def make_task(index: int) -> TaskSpec:
    """Task `index`: two distinct made-up words (the drills' training side, no common words)."""
    words = draw_words(random.Random(f"{FAMILY}-{index}"), 2, common_share=0.0)
    return TaskSpec(family=FAMILY, task_id=f"{FAMILY}-{index}", params={"words": words})


def user_message(task: TaskSpec) -> str:
    return "Words: " + " ".join(task.params["words"])


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    words: list[str] = task.params["words"]
    answers = [a for a in worker_answers(outcome) if a.strip()]
    workers = best_assignment(answers, words)
    delegated = min(len(answers), len(words)) / len(words)
    parent = read_back_score(outcome.final_answer, words)
    worker_mean = sum(workers) / len(workers)
    return RewardResult(
        reward=0.5 * worker_mean + 0.5 * parent * delegated,
        details={"workers": worker_mean, "parent": parent, "delegated": delegated},
    )
