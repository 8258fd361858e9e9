"""The process side of a runner-launched Python harness: `python -m harnesses.clients.program`.

grove's harness runner (activities/harness.py, `RunConfig.harness = {kind: python, python: {entry:
"package.module:function"}}`) starts this module once per episode launch, in the episode's own folder,
with an environment built from scratch (harnesses/python_harness.py): the episode in $GROVE_BASE_URL,
$GROVE_API_KEY and $GROVE_LAUNCH, the job in $GROVE_HARNESS_JOB (JSON: entry, task, options, model).

    def run(harness: HarnessContext) -> str | dict:      # or async def
        grove = GroveGraphs(harness.episode)             # every request carries x-grove-launch
        ...
        return final_answer                              # or {"final_answer": ..., "outputs": {...}}

What it prints on stdout (JSON lines, read by the runner; anything else the program prints is skipped):
`grove.started`, then `grove.result` {final_answer, outputs} when the function returned. An entry that
cannot be imported or found gives one `grove.entry_error` {error} and exit code 3 (a configuration
error: the runner does not relaunch it); an exception of the program goes to stderr with exit code 1
(the runner closes the episode as failed, with the last stderr lines). The program does not close the
episode: the runner does, with what it returned (no outputs: each agent's last answer from the ledger).

Light on purpose, like the rest of harnesses.clients: only the entry's own imports are heavy.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harnesses.clients import Episode

JOB_ENV = "GROVE_HARNESS_JOB"
EXIT_ENTRY_ERROR = 3
STARTED, RESULT, ENTRY_ERROR = "grove.started", "grove.result", "grove.entry_error"


@dataclass(frozen=True)
class HarnessContext:
    """What a harness program gets: the episode to talk to, its task and the run's options for it."""

    episode: Episode
    task: dict[str, Any]  # {"family", "task_id", "params"} (grove.contracts.TaskSpec as JSON)
    options: dict[str, Any] = field(default_factory=dict)  # RunConfig.harness.python.options
    model: str | None = None  # the model id the gateway serves (saves the program a GET /models)


class EntryError(ValueError):
    """The entry `module:function` cannot be imported or is not a function."""


def load_entry(entry: str) -> Callable[[HarnessContext], Any]:
    module_name, _, name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EntryError(
            f"harness entry {entry!r}: cannot import {module_name!r} ({err}); check harness.python.entry "
            "and that the harness worker's Python has the program's packages"
        ) from err
    fn = getattr(module, name, None)
    if not callable(fn):
        raise EntryError(f"harness entry {entry!r}: {module_name!r} has no function {name!r}")
    return fn


def result_event(value: Any) -> dict[str, Any]:
    """The program's return value as the `grove.result` event."""
    if isinstance(value, str):
        return {"type": RESULT, "final_answer": value, "outputs": {}}
    if isinstance(value, Mapping):
        outputs = {str(k): [str(t) for t in v] for k, v in (value.get("outputs") or {}).items()}
        return {"type": RESULT, "final_answer": str(value.get("final_answer", "")), "outputs": outputs}
    raise TypeError(
        f"the harness program returned a {type(value).__name__}; return the final answer (str) or a "
        "mapping {'final_answer': str, 'outputs': {agent: [texts]}}"
    )


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _await(value: Any) -> Any:
    return await value


def main() -> int:
    job = json.loads(os.environ[JOB_ENV])
    try:
        fn = load_entry(job["entry"])
    except EntryError as err:
        emit({"type": ENTRY_ERROR, "error": str(err)})
        return EXIT_ENTRY_ERROR
    context = HarnessContext(
        Episode.from_env(), job.get("task") or {}, job.get("options") or {}, job.get("model")
    )
    emit({"type": STARTED, "entry": job["entry"]})
    value = fn(context)
    if inspect.isawaitable(value):
        value = asyncio.run(_await(value))
    emit(result_event(value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
