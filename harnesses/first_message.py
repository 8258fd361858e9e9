"""The first user message of a launched harness's episode, as every launcher (OpenCode, Claude Code, Codex)
resolves it: the run's override, else the task family's setup, else the task's `params["message"]`."""

from __future__ import annotations

from grove.contracts import TaskSpec


def first_message(
    task: TaskSpec,
    override: str | None,
    family_message: str | None,
    *,
    harness: str,
    module: str,
    option: str,
    error: type[Exception],
) -> str:
    """The message (`family_message` None: the family has no setup); raises `error` naming the task, its
    family and the three ways to give one when there is none (`harness` as the user reads it, `module`
    the launcher's module, `option` its RunConfig key)."""
    message = override or (task.params.get("message") if family_message is None else family_message)
    if not message:
        raise error(
            f"task {task.task_id!r} of family {task.family!r}: no first message for {harness}; register "
            f"harnesses.{module}.TASK_SETUPS[{task.family!r}], give the task a params['message'], or set "
            f"harness.{option}.message"
        )
    return str(message)
