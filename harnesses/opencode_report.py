"""The `opencode-report` task family: `opencode-reader`'s episodes, rewarded for the shape of what the
agents write instead of for copying made-up words.

The episodes are `opencode-reader`'s (stock OpenCode, a restricted lead hands one word to each of two
`worker` subagents; each worker reads notes.txt, goes over its context limit and compacts, then answers
from its own summary: a compaction in every worker). Only the task ids (drawn under this family's name)
and the reward differ.

Why another reward: on `opencode-delegation` and `opencode-reader` the reward paid for copying the task's
made-up words, a skill the tiny policy does not have for unseen words; an update fit its own batch's words
and did not carry over to the next batch's (docs/tool_model.md), so nine pairs stayed flat. Here the
reward pays for a form that does not depend on the words, so what one batch teaches holds for every task:

- each worker's report (its last answer, which OpenCode hands the lead as the task's result),
  `report_score`: half for starting with the marker word REPORT_MARKER, half for staying within
  MAX_REPORT_WORDS words (no rambling after the answer); 0 for an empty report or one holding markup
  (tool-call junk: `<`, `>`, `{`, `}`);
- the lead: it must delegate to exactly the two workers the task has (`delegated`: two completed task
  results), and its final answer earns `final_score`: half for one line, half for exactly two words
  (the workers' two words as the lead relays them; any two words count: the reward reads no word);
  0 for an empty answer or one holding markup.

reward = (2 x workers + parent) / 3, where `workers` is the workers' mean report score (slots: two, or as
many workers as ran if more; a missing worker scores 0) and `parent` is delegated x the final answer's
score: each of the three texts of a well-run episode (two reports, one final answer) weighs the same.
Components: `workers`, `parent`, and the halves of each (`report_marker`, `report_short`,
`final_one_line`, `final_two_words`) and `delegated`, so a run's metrics show which behaviour moves.

Why per text and not half and half: every agent's rows in an episode share the episode's one reward, so
the lead's final answer is credited with its workers' reports and the other way round. On simulated
episodes (harnesses/opencode_delegation_sim.py, GRPO at the demo's lr and group) the half-and-half split
let the lead's more fragile answer, pushed about by its workers' spread, cancel most of what the workers
learned (docs/tool_model.md; the figures, measured before any run of this family, in docs/results.md
section 6).

The starting policy must write these shapes in some episodes and not in others, or a group's rewards
are all equal and GRPO has nothing to go on: `tiny-report` (models/registry.py) is `tiny-reader` drilled
on reports and final answers in several shapes at equal odds (models/report_drills.py), one of which is
the rewarded one. The reward is fixed before any training run on it (docs/tool_model.md,
"opencode-report").
"""

from __future__ import annotations

import re

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from harnesses import opencode_delegation, opencode_reader
from models.report_drills import REPORT_MARKER

FAMILY = "opencode-report"
WORKERS = 2  # the task's words: the lead should delegate each to its own worker, no more, no fewer
MAX_REPORT_WORDS = 3  # a report of at most this many words is short (the marker and the word: 2)
FINAL_WORDS = 2
_MARKUP = re.compile(r"[<>{}]")
DEFAULT_AGENT = opencode_reader.DEFAULT_AGENT
OPENCODE_AGENTS = opencode_reader.OPENCODE_AGENTS
WORKER_CONTEXT = opencode_reader.WORKER_CONTEXT
user_message = opencode_reader.user_message
project_files = opencode_reader.project_files
worker_answers = opencode_delegation.worker_answers


def make_task(index: int) -> TaskSpec:
    """Task `index`: two made-up words, drawn as `opencode-reader` draws them under this family's name
    (the lead's message and the notes.txt follow from the task, as there)."""
    return opencode_delegation.make_task(index, family=FAMILY)


def _clean(text: str) -> str | None:
    """The text stripped, or None when it is empty or holds markup (a tool call written as text)."""
    text = text.strip()
    return None if not text or _MARKUP.search(text) else text


def report_parts(report: str) -> dict[str, float]:
    """`report_marker` (the first word is REPORT_MARKER) and `report_short` (at most MAX_REPORT_WORDS
    words), each 0 or 1; both 0 for an empty report or one with markup."""
    text = _clean(report)
    if text is None:
        return {"report_marker": 0.0, "report_short": 0.0}
    words = text.split()
    return {
        "report_marker": float(words[0] == REPORT_MARKER),
        "report_short": float(len(words) <= MAX_REPORT_WORDS),
    }


def report_score(report: str) -> float:
    """A worker's report in [0, 1]: half for the marker first, half for being short (`report_parts`)."""
    return sum(report_parts(report).values()) / 2


def final_parts(final_answer: str) -> dict[str, float]:
    """`final_one_line` (no line break) and `final_two_words` (exactly FINAL_WORDS words), each 0 or 1;
    both 0 for an empty answer or one with markup."""
    text = _clean(final_answer)
    if text is None:
        return {"final_one_line": 0.0, "final_two_words": 0.0}
    return {
        "final_one_line": float("\n" not in text),
        "final_two_words": float(len(text.split()) == FINAL_WORDS),
    }


def final_score(final_answer: str) -> float:
    """The lead's final answer in [0, 1]: half for one line, half for exactly two words (`final_parts`)."""
    return sum(final_parts(final_answer).values()) / 2


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    reports = worker_answers(outcome)
    slots = max(WORKERS, len(reports))
    parts = [report_parts(r) for r in reports]
    workers = sum(report_score(r) for r in reports) / slots
    delegated = float(len(reports) == WORKERS)
    finals = final_parts(outcome.final_answer)
    parent = delegated * final_score(outcome.final_answer)
    details = {
        "workers": workers,
        "parent": parent,
        "report_marker": sum(p["report_marker"] for p in parts) / slots,
        "report_short": sum(p["report_short"] for p in parts) / slots,
        "delegated": delegated,
        **finals,
    }
    return RewardResult(reward=(2 * workers + parent) / 3, details=details)
