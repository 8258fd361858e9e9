"""Report shapes: the forms in which `tiny-report` drills an OpenCode worker's report and the lead's final
answer, so that the starting policy writes each of them some of the time.

The `opencode-report` family (harnesses/opencode_report.py) rewards one shape of each (a worker report
that starts with REPORT_MARKER and stays short; a lead answer of two words on one line). For GRPO to
have a signal, the policy must already write that shape in some episodes of a group and other shapes in
others: `tiny-reader` writes the bare word every time (it was drilled on nothing else), so its
reports all score alike. An instruction-tuned model answers in several forms; these drills give the
tiny model that spread on purpose, every shape at equal odds, and leave it to RL to pick the one the
reward asks for. Which shape to write does not depend on the task's words, so what an update learns on
one batch applies to the next one's other words (docs/tool_model.md, "opencode-report").

Pure text: no model, no I/O.
"""

from __future__ import annotations

import random

REPORT_MARKER = "DONE"
_NOUNS = ("gate", "door", "road", "lamp", "tree", "wall", "bell", "ship", "desk", "rope", "mill", "well")
_ADJECTIVES = ("red", "slow", "old", "new", "cold", "wide", "dark", "calm", "loud", "tall", "soft", "dry")
# a worker's report after compaction (its last answer: the text OpenCode hands the lead as the task's
# result); only the second is the rewarded shape
REPORT_SHAPES = (
    "{w}",
    REPORT_MARKER + " {w}",
    "The word is {w}.",
    REPORT_MARKER + " {w}\n{ramble}",
    "{w}\n{ramble}",
)
# the lead's final answer after both task results; only the first is the rewarded shape
FINAL_SHAPES = (
    "{w1} {w2}",
    "{w1}\n{w2}",
    "The workers said {w1} and {w2}.",
    "{w1} {w2}\n{ramble}",
)


def ramble(rng: random.Random) -> str:
    """Talk after the answer: what the worker did, in common words (nothing to copy)."""
    return (
        f"I read notes.txt. The {rng.choice(_NOUNS)} is {rng.choice(_ADJECTIVES)} and the "
        f"{rng.choice(_NOUNS)} is {rng.choice(_ADJECTIVES)}."
    )


def worker_report(rng: random.Random, word: str) -> str:
    """A worker's report of `word` in a shape drawn at equal odds."""
    return rng.choice(REPORT_SHAPES).format(w=word, ramble=ramble(rng))


def final_answer(rng: random.Random, words: list[str]) -> str:
    """The lead's final answer with the two words, in a shape drawn at equal odds."""
    first, second = words
    return rng.choice(FINAL_SHAPES).format(w1=first, w2=second, ramble=ramble(rng))
