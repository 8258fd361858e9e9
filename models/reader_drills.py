"""What an `opencode-reader` worker sees and should answer, rendered from OpenCode's captured text.

The `opencode-reader` family (harnesses/opencode_reader.py) gives each worker subagent OpenCode's `read`
tool and a `notes.txt` in the episode's project folder, and a context limit that the notes push it over:
a worker compacts mid-way. Its four requests, captured from opencode-ai 1.18.33
(models/harness_text/opencode_1_18_33_reader.json):

1. first request (`read` offered): -> `read({"filePath": "notes.txt"})`;
2. the read's result (`<path>...</path>\\n<type>file</type>\\n<content>\\n1: ...`): -> the word;
3. the compaction call (the conversation flattened: `[User]: ...`, `[Assistant tool call]: read(...)`,
   `[Tool result]: ...` cut at 2,000 characters, `[Assistant]: ...`): -> OpenCode's template filled in,
   the word in it;
4. the rewritten session ("What did we do so far?", the summary, "Continue if you have next steps..."):
   -> the word again, read from the summary (OpenCode keeps the last answer: the worker's output).

Everything variable (word, working directory, notes, dates) is drawn from the writer's seeded stream.
Pure text: no model, no I/O beyond the captured file.
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any

from models.tool_drills import _compaction_turns, _summary_texts

READER_TEXT = Path(__file__).parent / "harness_text" / "opencode_1_18_33_reader.json"
READER_PROMPT = "You are a worker. Read notes.txt, then reply with the word you are given."
NOTES_FILE = "notes.txt"
# OpenCode's compaction call cuts each tool result at this many characters (measured: `[truncated]`)
SUMMARY_RESULT_CHARS = 2000
_NOUNS = ("gate", "door", "road", "lamp", "tree", "wall", "bell", "ship", "desk", "rope", "mill", "well")
_ADJECTIVES = ("red", "slow", "old", "new", "cold", "wide", "dark", "calm", "loud", "tall", "soft", "dry")


@cache
def reader_requests() -> dict[str, dict[str, Any]]:
    return json.loads(READER_TEXT.read_text())["requests"]


def read_tool() -> dict[str, Any]:
    """OpenCode's `read` tool, as the worker's requests offer it."""
    return reader_requests()["worker_first"]["tools"][0]


def notes_text(rng: random.Random, lines: int) -> str:
    """A notes file of `lines` plain lines (common words only: nothing in it to copy by mistake)."""
    return "".join(
        f"Note {k}: the {rng.choice(_NOUNS)} is {rng.choice(_ADJECTIVES)} and {rng.choice(_ADJECTIVES)}.\n"
        for k in range(1, lines + 1)
    )


def read_result(folder: str, notes: str) -> str:
    """OpenCode's `read` result for `<folder>/notes.txt` (1.18.33: numbered lines in a wrapper)."""
    body = notes[:-1] if notes.endswith("\n") else notes
    numbered = "\n".join(f"{i}: {line}" for i, line in enumerate(body.split("\n"), start=1))
    total = len(body.split("\n"))
    return (
        f"<path>{folder}/{NOTES_FILE}</path>\n<type>file</type>\n<content>\n{numbered}\n\n"
        f"(End of file - total {total} lines)\n</content>"
    )


def read_call() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "read", "arguments": {"filePath": NOTES_FILE}}}


def summary_text(ask: str, word: str) -> str:
    """The summary the drills teach: OpenCode's template, the word in it twice, nothing else long."""
    return (
        f"## Objective\n- {ask}\n\n## Important Details\n- The word is {word}.\n\n## Work State\n"
        f"### Completed\n- Read {NOTES_FILE}.\n\n### Active\n- (none)\n\n### Blocked\n- (none)\n\n"
        f"## Next Move\n1. Reply with {word}.\n2. (none)\n\n## Relevant Files\n- {NOTES_FILE}"
    )


def worker_turns(system: str, ask: str, result: str, word: str) -> list[dict[str, Any]]:
    """Requests 1 and 2 as one chat: the read call, its result, the word."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": ask},
        {"role": "assistant", "content": "", "tool_calls": [read_call()]},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": word},
    ]


def summary_turns(ask: str, result: str, word: str) -> list[dict[str, Any]]:
    """Request 3: the compaction call on that conversation, answered with the summary."""
    system, before, after = _summary_texts()
    cut = result[:SUMMARY_RESULT_CHARS] + ("\n[truncated]" if len(result) > SUMMARY_RESULT_CHARS else "")
    arguments = json.dumps({"filePath": NOTES_FILE}, separators=(",", ":"))  # as OpenCode re-sends them
    conversation = (
        f"[User]: {ask}\n\n[Assistant tool call]: read({arguments})\n[Tool result]: {cut}\n\n"
        f"[Assistant]: {word}\n"
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": before + conversation + after},
        {"role": "assistant", "content": summary_text(ask, word)},
    ]


def after_compaction_turns(
    system: str, ask: str, word: str, report: str | None = None
) -> list[dict[str, Any]]:
    """Request 4: the rewritten session, answered with the word (or `report`: the word in another shape,
    models/report_drills.py)."""
    question, cont = _compaction_turns()
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {"role": "assistant", "content": summary_text(ask, word)},
        {"role": "user", "content": cont},
        {"role": "assistant", "content": word if report is None else report},
    ]
