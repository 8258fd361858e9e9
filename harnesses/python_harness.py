"""A Python harness program as an episode's harness: how the runner launches it and reads its outcome.

    RunConfig.harness = {kind: python, python: {entry: "harnesses.langgraph_delegation:run", options: {}}}

The harness runner (activities/harness.py) launches `<the worker's python> -m harnesses.clients.program`
once per episode launch (harnesses/clients/program.py is the process side) with the same supervision as
OpenCode: its own folder and process group, heartbeats, the deadline, the kill, relaunches. This module
is the pure part: the command line, the whole environment, and the outcome read from its events.

- Environment: built from scratch, like OpenCode's: PATH (the interpreter's folder first), its own
  HOME/XDG/TMPDIR under the launch's folder, PYTHONPATH = grove's source tree (so `harnesses.clients`
  and the task families' programs import), the episode's URL, token and launch number, and the job
  (entry, task, options, served model). Nothing else of the worker's environment reaches it.
- Outcome: the `grove.result` event's final answer and outputs; none (the program failed, or was
  killed): an empty outcome, the failure says why. Outputs the program leaves out are read from the
  ledger by the episode (each agent's last answer, `LEDGER_OUTPUT_KINDS`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grove.contracts import HarnessOutcome, TaskSpec
from harnesses.clients import API_KEY_ENV, BASE_URL_ENV, LAUNCH_ENV
from harnesses.clients.program import ENTRY_ERROR, JOB_ENV, RESULT
from harnesses.sandbox import SYSTEM_PATH, sandbox_env

SOURCE_ROOT = Path(__file__).resolve().parents[1]  # grove's tree: harnesses/, grove/, ...
PROGRAM_MODULE = "harnesses.clients.program"


def python_argv(python: str = sys.executable) -> list[str]:
    """The interpreter (the worker's: same packages) running the harness side of the protocol."""
    return [python, "-u", "-m", PROGRAM_MODULE]


def python_job(entry: str, task: TaskSpec, options: dict[str, Any], model: str) -> str:
    return json.dumps(
        {"entry": entry, "task": task.model_dump(mode="json"), "options": options, "model": model}
    )


def python_env(
    home: str, job: str, base_url: str, token: str, launch: int, python: str = sys.executable
) -> dict[str, str]:
    """The whole environment of a Python harness process (see the module docstring)."""
    return sandbox_env(
        home,
        f"{Path(python).parent}:{SYSTEM_PATH}",
        PYTHONPATH=str(SOURCE_ROOT),
        PYTHONNOUSERSITE="1",  # the worker's packages, not whatever a user site holds
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        **{BASE_URL_ENV: base_url, API_KEY_ENV: token, LAUNCH_ENV: str(launch), JOB_ENV: job},
    )


def entry_error(events: list[dict[str, Any]]) -> str | None:
    """The program's entry could not be loaded (a configuration error, not the policy's)."""
    for event in events:
        if event.get("type") == ENTRY_ERROR:
            return str(event.get("error"))
    return None


def outcome_of_events(events: list[dict[str, Any]]) -> HarnessOutcome:
    result = next((e for e in reversed(events) if e.get("type") == RESULT), None)
    if result is None:
        return HarnessOutcome(failure="the harness program returned no result")
    return HarnessOutcome(
        final_answer=str(result.get("final_answer", "")), outputs=result.get("outputs") or {}
    )
