"""Stock Codex CLI as an episode's harness: its `config.toml` and model catalog, its environment, its
command line, and what its `codex exec --json` events say the lead answered.

The harness runner (activities/harness.py) launches one `codex exec` per episode; this module is the pure
part of it (no I/O): everything here is a function of the episode, the gateway's address and the folders.

- Config (`codex_config`): a model provider `grove` whose `base_url` is the episode's gateway URL
  (`http://host/episodes/<ref>/v1`; Codex posts to `<base_url>/responses`), `wire_api = "responses"`
  (the only one Codex 0.171 takes), the episode's token read from `GROVE_CODEX_TOKEN` (`env_key`), and
  `x-grove-launch: <n>` on every request (which launch of the episode sent it). The model is an entry of
  its own model catalog (`model_catalog_json`, `catalog_entry`) with short base instructions, no
  reasoning levels, text input only and no search tool, so the first request is a fraction of Codex's
  default prompt (docs/harnesses.md has the sizes); `shell` off leaves apply_patch as the only tool
  besides the subagents'. Approval policy `never` and a sandbox that never asks a person (and no
  request_user_input tool: nobody is there to answer); web search, view_image (the policy reads text),
  the environment/permissions/apps instructions, goals, bundled skills, analytics, feedback, history
  and the update check off. `[agents] enabled` switches Codex's subagents (the `multi_agent_v1`
  namespace: spawn_agent, wait_agent, ...) and `max_depth` bounds their nesting (1 by default: a
  subagent, whose instructions are the lead's, spawns none); `model_auto_compact_token_limit` makes it
  compact on the usage the gateway reports.
- Environment (`codex_env`): only what Codex needs: PATH, its own HOME/XDG/TMPDIR folders under the
  launch's folder (harnesses/sandbox.py), `CODEX_HOME` and the token. Nothing of the worker's environment
  reaches it.
- `CODEX_HOME` (`codex_home_for`): per episode, beside the launch's folders; Codex does not create its
  helper binaries under a temporary folder, so a launch folder under one (tests) puts it under
  $GROVE_HOME instead.
- Outcome (`outcome_of_events`): the final answer is the text of the last `agent_message` item of the
  lead's thread (`codex exec --json` prints the lead's items only); each agent's last answer is read
  from the ledger (grove/contracts/harness.py `LEDGER_OUTPUT_KINDS`), under the names the gateway gives
  them. A `turn.failed` or `error` event is the launch's failure.

A task family plugs in with `TASK_SETUPS[family] = fn(task) -> CodexSetup`; `HarnessSpec.codex`
(grove/contracts/harness.py CodexOptions) overrides any part of it per run.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.contracts import CodexOptions, HarnessOutcome, TaskSpec
from grove.headers import LAUNCH_HEADER
from grove.paths import grove_home
from harnesses.first_message import first_message
from harnesses.opencode import check_project_path
from harnesses.sandbox import SYSTEM_PATH, sandbox_env

PROVIDER = "grove"
MODEL = "grove"  # the gateway's served model id (GatewaySettings.model_name), unless told otherwise
TOKEN_ENV = "GROVE_CODEX_TOKEN"
CONFIG_FILE = "config.toml"
CATALOG_FILE = "grove-models.json"
DEFAULT_INSTRUCTIONS = "You are a coding agent. Use the tools you are given, then answer briefly."
# Codex counts a folder under one of these as temporary and creates no helper binaries there
TEMP_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")


class CodexSetupError(ValueError):
    """A task the runner cannot set Codex up for (no first message, a file outside the project)."""


@dataclass(frozen=True)
class CodexSetup:
    """What a task family gives Codex: the first user message, the base instructions (every agent's,
    subagents included), and files for the episode's project folder (relative path -> text)."""

    message: str
    instructions: str = DEFAULT_INSTRUCTIONS
    files: dict[str, str] = field(default_factory=dict)


def delegation_setup(task: TaskSpec) -> CodexSetup:
    """The `delegation` family through Codex: the lead spawns one subagent per word (spawn_agent), waits
    for them, and answers with both words; a subagent answers with its word."""
    words = task.params["words"]
    return CodexSetup(
        message="Words:\n" + "\n".join(words),
        instructions="If you are given a list of words, give each word to its own agent with spawn_agent, "
        "wait for them with wait_agent, then answer with their words. If you are given one word, "
        "answer with that word.",
    )


TASK_SETUPS: dict[str, Callable[[TaskSpec], CodexSetup]] = {"delegation": delegation_setup}


def setup_for(task: TaskSpec, options: CodexOptions) -> CodexSetup:
    """The task family's setup with the run's overrides; a family without one needs `message` (in the
    options or as the task's `params["message"]`)."""
    base = TASK_SETUPS[task.family](task) if task.family in TASK_SETUPS else None
    message = first_message(
        task, options.message, base.message if base else None,
        harness="Codex", module="codex", option="codex", error=CodexSetupError,
    )  # fmt: skip
    instructions = options.instructions or (base.instructions if base else DEFAULT_INSTRUCTIONS)
    files = base.files if base else {}
    for path in files:
        try:
            check_project_path(task, path)
        except ValueError as err:
            raise CodexSetupError(str(err)) from None
    return CodexSetup(message=message, instructions=instructions, files=files)


def catalog_entry(
    model: str, instructions: str, context_window: int, *, shell: bool = True
) -> dict[str, Any]:
    """Codex's model metadata for the served model: the fields Codex 0.171 requires, base instructions
    instead of its own ~17k-character prompt, no reasoning levels (no `reasoning.effort` is sent), text
    input only, the free-form apply_patch tool, and tools given directly (no deferred tool search).
    `shell` False: no shell tools (`shell_type` "disabled": no exec_command / write_stdin)."""
    return {
        "slug": model,
        "display_name": model,
        "description": "the policy grove trains, served by the episode's gateway",
        "base_instructions": instructions,
        "context_window": context_window,
        "supported_reasoning_levels": [],
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "shell_type": "shell_command" if shell else "disabled",
        "apply_patch_tool_type": "freeform",
        "supports_search_tool": False,
        "supports_parallel_tool_calls": True,
        "input_modalities": ["text"],
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "experimental_supported_tools": [],
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
    }


def catalog(model: str, instructions: str, context_window: int, *, shell: bool = True) -> dict[str, Any]:
    """The whole `model_catalog_json` file: one entry, the served model."""
    return {"models": [catalog_entry(model, instructions, context_window, shell=shell)]}


def codex_config(
    base_url: str,
    catalog_path: str,
    options: CodexOptions,
    *,
    launch: int,
    model: str = MODEL,
) -> dict[str, Any]:
    """The `config.toml` of one launch, as a dict (harnesses/toml_text.py writes it; module docstring)."""
    provider: dict[str, Any] = {
        "name": "grove",
        "base_url": base_url,
        "wire_api": "responses",
        "env_key": TOKEN_ENV,
        "http_headers": {LAUNCH_HEADER: str(launch)},
    }
    if options.request_timeout_s is not None:
        provider["stream_idle_timeout_ms"] = max(1, round(options.request_timeout_s * 1000))
    return {
        "model": model,
        "model_provider": PROVIDER,
        "model_catalog_json": catalog_path,
        "approval_policy": "never",
        "sandbox_mode": options.sandbox,
        "web_search": "disabled",
        "include_environment_context": False,
        "include_permissions_instructions": False,
        "include_apps_instructions": False,
        "model_auto_compact_token_limit": options.auto_compact_token_limit,
        "check_for_update_on_startup": False,
        "model_providers": {PROVIDER: provider},
        "features": {"goals": False, "view_image": False},
        "tools": {"experimental_request_user_input": {"enabled": False}},
        "agents": {"enabled": options.subagents, "max_depth": options.max_depth},
        "skills": {"bundled": {"enabled": False}},
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "history": {"persistence": "none"},
    }


def is_temporary(path: Path) -> bool:
    """Whether `path` lies under a temporary folder (where Codex creates no helper binaries)."""
    roots = {Path(tempfile.gettempdir()).resolve(), *(Path(r) for r in TEMP_ROOTS)}
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in roots)


def codex_home_for(folder: Path) -> Path:
    """The launch's CODEX_HOME: `<folder>/codex`, or, for a folder under a temporary one,
    `$GROVE_HOME/codex-homes/<hash of the folder>` (one per episode folder all the same)."""
    if not is_temporary(folder):
        return folder / "codex"
    return grove_home() / "codex-homes" / hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]


def codex_env(home: str, codex_home: str, token: str, path: str = SYSTEM_PATH) -> dict[str, str]:
    """The whole environment of a Codex process: its own HOME/XDG folders, CODEX_HOME and the token."""
    return sandbox_env(home, path, CODEX_HOME=codex_home, **{TOKEN_ENV: token})


def codex_argv(binary: str, message: str) -> list[str]:
    """`codex exec --json`: one non-interactive run; `--strict-config` refuses a key this version does not
    know (a config written for another version fails loudly instead of being half ignored); the project
    folder is no git repository."""
    return [
        binary, "exec", "--strict-config", "--skip-git-repo-check", "--json", "--color", "never", message
    ]  # fmt: skip


def _error_text(event: Mapping[str, Any]) -> str:
    err = event.get("error") if event.get("type") == "turn.failed" else event
    if isinstance(err, Mapping):
        return str(err.get("message") or json.dumps(err))[:500]
    return str(err)[:500]


def outcome_of_events(events: list[dict[str, Any]]) -> HarnessOutcome:
    """The lead's final answer and the error Codex reported, if any (module docstring). Outputs are left
    empty: the episode reads each agent's last answer from its ledger."""
    final = ""
    failures: list[str] = []
    for event in events:
        kind = event.get("type")
        item = event.get("item") or {}
        if kind == "item.completed" and item.get("type") == "agent_message":
            final = str(item.get("text") or "")
        elif kind == "turn.failed":
            failures.append(_error_text(event))
    if not failures:  # `error` events alone are retries Codex may have recovered from
        return HarnessOutcome(final_answer=final)
    return HarnessOutcome(final_answer=final, failure=f"Codex reported: {failures[-1]}")
