"""The `langgraph-delegation` and `agents-sdk-delegation` task families: `delegation` driven by a harness
framework's program, launched per episode by the harness runner (RunConfig.harness.kind `python`).

    langgraph-delegation   harnesses/langgraph_delegation.py:run   a supervisor graph, two `Send` workers
                           running concurrently; the second compacts its history with LangChain's
                           SummarizationMiddleware before it answers (an auxiliary summary call, then a
                           declared rewrite of its context)
    agents-sdk-delegation  harnesses/agents_sdk_delegation.py:run  an Agents SDK lead with two worker tools
                           invoked concurrently: the worker agent `as_tool`, and a worker with a history
                           (a `function_tool` running the worker on a warm-up turn, then its word under the
                           program's summarising `call_model_input_filter`: an auxiliary summary call,
                           then a declared rewrite of its context)

Tasks are `delegation`'s (the same word pairs, named by this family). The reward has `delegation`'s
shape, 0.5 x the workers' mean score + 0.5 x the parent's, with credit no fixed answer can collect:
a worker's answer scores by `delegation.word_score` (1 for its word, ~0.5 on average for any answer that
does not depend on the word, such as a constant word or a sentence; 0 for an empty or missing one), the
parent by `delegation.named_score` (the fraction of the two words it names, less one per other word of
the vocabulary it names). Under `delegation`'s plain similarity a LangGraph pair learns to answer
"sand" everywhere, the best-paid constant. (The native family keeps plain similarity: its demo's
results, docs/results.md section 1.1, were measured under it.)

The programs return only the final answer; each agent's last answer comes from the ledger
(the episode fills the outputs, LEDGER_OUTPUT_KINDS), under the names the framework adapters give the
workers (`worker-1`, `worker-2` in LangGraph; `<agent name>-<tool call id>` in the Agents SDK). Which
worker got which word is not in those names, so the workers fill the word slots by the assignment that
scores best (harnesses/opencode_delegation.best_assignment, as for OpenCode's subagents).

This module is light (no framework import): the workers that score episodes import it.
"""

from __future__ import annotations

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses import delegation
from harnesses.opencode_delegation import best_assignment

LANGGRAPH = "langgraph-delegation"
AGENTS_SDK = "agents-sdk-delegation"
ENTRIES = {
    LANGGRAPH: "harnesses.langgraph_delegation:run",
    AGENTS_SDK: "harnesses.agents_sdk_delegation:run",
}
ROOT_AGENT = "parent"
AUX_MARK = "~"  # auxiliary agents (`worker-2~aux`: a summary call) are no workers


def make_task_of(family: str):
    def make_task(index: int) -> TaskSpec:
        base = delegation.make_task(index)
        return TaskSpec(family=family, task_id=f"{family}-{index}", params=base.params)

    return make_task


def worker_answers(outcome: HarnessOutcome) -> list[str]:
    """The last answer of every agent but the root and auxiliary agents."""
    return [
        texts[-1]
        for agent, texts in outcome.outputs.items()
        if agent != ROOT_AGENT and AUX_MARK not in agent and texts
    ]


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    words: list[str] = task.params["words"]
    workers = best_assignment(worker_answers(outcome), words, credit=delegation.word_score)
    parent = delegation.named_score(outcome.final_answer, words)
    worker_mean = sum(workers) / len(workers)
    return RewardResult(
        reward=0.5 * worker_mean + 0.5 * parent, details={"workers": worker_mean, "parent": parent}
    )
