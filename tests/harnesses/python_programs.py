"""Harness programs the Python-harness tests launch (`tests.harnesses.python_programs:<name>`); each runs
in the harness process the runner starts (harnesses/clients/program.py), not in pytest's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from harnesses.clients.program import HarnessContext


async def report(harness: HarnessContext) -> dict:
    """Says what it was given: the episode, its launch, the task, the options, where it runs."""
    words = harness.task["params"]["words"]
    return {
        "final_answer": " ".join(words),
        "outputs": {
            "parent": [harness.episode.base_url, harness.episode.api_key],
            "launch": [str(harness.episode.launch), harness.episode.headers.get("x-grove-launch", "")],
            "options": [str(harness.options.get("colour")), str(harness.model)],
            "where": [os.getcwd(), os.environ["HOME"], str(sorted(os.environ))],
        },
    }


def plain(harness: HarnessContext) -> str:
    return "plain answer"


def fails(harness: HarnessContext) -> str:
    raise RuntimeError("the program gave up: no words")


def returns_a_number(harness: HarnessContext) -> int:
    return 42


def hangs(harness: HarnessContext) -> str:
    """Starts a grandchild in its process group, notes its pid, then never returns."""
    child = subprocess.Popen(["sleep", "1000"])
    Path(os.environ["HOME"], "grandchild.pid").write_text(str(child.pid))
    child.wait()
    return "never"
