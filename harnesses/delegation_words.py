"""The `delegation` task family's text: its words, its prompts and which words task i gives.

Pure stdlib, apart from harnesses/delegation.py (which runs episodes and imports the native harness,
Temporal included), so that what only needs the text imports only this: the learner benchmark's
demo-shaped episodes (bench/forests.py) on a machine without Temporal, and the framework programs
(harnesses/langgraph_delegation.py, harnesses/agents_sdk_delegation.py).
"""

from __future__ import annotations

FAMILY = "delegation"
WORDS = (
    "red", "blue", "green", "cat", "dog", "sun", "moon", "tree",
    "fish", "bird", "star", "rain", "snow", "milk", "book", "door",
)  # fmt: skip

PARENT_SYSTEM = "You are the lead. Give each word to a worker, then answer with both words."
WORKER_SYSTEM = "You are a worker. Answer with the word you are given."
# the framework programs' compacting worker first gets this turn, so it has a history to summarise
WARM_UP = "Get ready for your word."


def task_words(index: int) -> list[str]:
    """The ordered pair of distinct words of task `index`."""
    n = len(WORDS)
    first = index % n
    second = (first + 1 + (index // n) % (n - 1)) % n
    return [WORDS[first], WORDS[second]]
