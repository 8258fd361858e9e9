"""The `opencode-reader` task family: `opencode-delegation` with workers that compact mid-way.

The lead is `opencode-delegation`'s (only the `task` tool; one word to each of two `worker` subagents,
then both words back). Each worker has OpenCode's `read` tool and is told to read `notes.txt` (a plain
file of NOTES_LINES lines the runner writes into the episode's project folder) before it answers its
word. The workers' model entry declares a `limit.context` (WORKER_CONTEXT) that the notes push the
worker over, so OpenCode compacts the worker's session mid-episode and the worker answers once more
from its own summary; the outcome's worker answer is that last one, so the summary decides the workers'
half of the reward.

Why a tool: OpenCode compacts after a step whose reported usage reaches `limit.context - limit.output`,
then adds "Continue if you have next steps..." and runs another step, compacting again while that is
over the line. A worker that answers in one turn cannot compact without looping: the summary makes its
context longer, not shorter (docs/tool_model.md). Here the read result is what the summary drops. In
`tiny-reader`'s tokens (models/reader_drills.py drills, 16 notes lines): the worker's first request is
~800 tokens (the `read` tool's schema is most of it), after the read ~1,200, after compaction ~950;
WORKER_CONTEXT puts the line between the last two (docs/tool_model.md has the token counts).

Tasks are `opencode-delegation`'s words (drawn under this family's name) plus the notes, a pure function
of the index; the reward is `opencode-delegation`'s (workers' answers against the words, the lead's
read-back).
"""

from __future__ import annotations

import random

from grove.contracts import TaskSpec
from harnesses import opencode_delegation
from models.reader_drills import NOTES_FILE, READER_PROMPT, notes_text

FAMILY = "opencode-reader"
NOTES_LINES = 16
# the worker's `limit.context`: OpenCode compacts at WORKER_CONTEXT - limit.output (the run's max_tokens,
# 128 in the demo): ~1,070, between the worker's context after compaction and after the read
WORKER_CONTEXT = 1200
DEFAULT_AGENT = opencode_delegation.DEFAULT_AGENT
OPENCODE_AGENTS: dict[str, dict] = {
    **opencode_delegation.OPENCODE_AGENTS,
    "worker": {
        "mode": "subagent",
        "description": opencode_delegation.OPENCODE_AGENTS["worker"]["description"],
        "prompt": READER_PROMPT,
        "tools": {"*": False, "read": True},
    },
}
score = opencode_delegation.score
user_message = opencode_delegation.user_message


def make_task(index: int) -> TaskSpec:
    """Task `index`: two made-up words, drawn as `opencode-delegation` draws them under this family's name
    (its notes follow from the task id: `notes`)."""
    return opencode_delegation.make_task(index, family=FAMILY)


def notes(task: TaskSpec) -> str:
    """The task's notes.txt (common words only, nothing to copy by mistake)."""
    return notes_text(random.Random(f"{task.task_id}-notes"), NOTES_LINES)


def project_files(task: TaskSpec) -> dict[str, str]:
    """Files the runner writes into the episode's project folder before OpenCode starts."""
    return {NOTES_FILE: notes(task)}
