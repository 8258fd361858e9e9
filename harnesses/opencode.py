"""Stock OpenCode as an episode's harness: its `opencode.json`, its environment, its first message, and
what its `opencode run --format json` events say the agents answered.

The harness runner (activities/harness.py) launches one `opencode run` per episode; this module is the
pure part of it (no I/O): everything here is a function of the episode and the gateway's address.

- Config: a provider `grove` (`@ai-sdk/openai-compatible`, bundled in the binary) whose `baseURL` is the
  episode's gateway URL and whose `apiKey` is the episode's token, one model `grove/<the gateway's model
  id>` with `tool_call: true` and `limit: {context, output}` (OpenCode compacts on the usage the gateway
  reports against `limit.context`), `x-grove-launch: <n>` on every request (which launch of the episode
  sent it), sharing/autoupdate/LSP off, and the agents the task family defines (`TASK_SETUPS`; a
  restricted primary agent with only the `task` tool keeps the fixed prompt ~1,840 tokens in the tiny
  model's tokenizer, ~960 in tiny-tools').
- Environment: only what OpenCode needs: PATH, its own HOME and XDG folders under the launch's folder,
  and its offline switches. Nothing of the worker's environment (secrets,
  other episodes' tokens) reaches it.
- Outcome (`outcome_of_events`): the parent's final answer is the text of the root session's last
  message with text; each `task` tool call's result (`<task id="ses_..."><task_result>...`) is a
  subagent's last output, under the subagent's name: its agent type, with an index when the type ran
  before (`worker`, `worker-2`, `researcher`: harnesses/opencode_agents.py), counted in the order the
  parent wrote the calls, as the gateway's ledger names the subagents' contexts.

A task family plugs in with `TASK_SETUPS[family] = fn(task) -> OpenCodeSetup`; `HarnessSpec.opencode`
(grove/contracts/harness.py OpenCodeOptions) overrides any part of it per run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from grove.contracts import HarnessOutcome, OpenCodeOptions, TaskSpec
from grove.headers import LAUNCH_HEADER
from harnesses import opencode_delegation, opencode_reader, opencode_report
from harnesses.first_message import first_message
from harnesses.opencode_agents import subagent_names
from harnesses.sandbox import SYSTEM_PATH, sandbox_env

PROVIDER = "grove"
MODEL = "grove"  # the gateway's served model id (GatewaySettings.model_name), unless told otherwise
OFFLINE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
}
_TASK_RESULT = re.compile(
    r'<task id="(?P<session>[^"]*)"[^>]*>\s*<task_result>\n?(?P<text>.*?)\n?</task_result>', re.DOTALL
)


class OpenCodeSetupError(ValueError):
    """A task the runner cannot set OpenCode up for (no first message, no agents)."""


@dataclass(frozen=True)
class OpenCodeSetup:
    """What a task family gives OpenCode: the first user message, the `agent` section, the agents whose
    `limit.context` differs (so that they compact), and files for the episode's project folder (relative
    path -> text)."""

    message: str
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_agent: str | None = None
    agent_context_limits: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


def delegation_setup(task: TaskSpec) -> OpenCodeSetup:
    """The `delegation` family through OpenCode: a restricted lead (only the `task` tool) hands each word
    to a `worker` subagent; the workers answer with their word; the lead answers with both."""
    words = task.params["words"]
    return OpenCodeSetup(
        message="Words:\n" + "\n".join(words),
        agents=restricted_agents(
            lead="You are the lead. Give each word to a worker with the task tool, then answer with both "
            "words.",
            worker="You are a worker. Answer with the word you are given.",
            worker_description="Repeats the word it is given.",
        ),
        default_agent="lead",
    )


def restricted_agents(lead: str, worker: str, worker_description: str) -> dict[str, dict[str, Any]]:
    """A primary `lead` with only the `task` tool and a tool-less `worker` subagent; OpenCode's own
    `explore`/`general` subagents and its title agent off (the lead's first request is then ~1,840 tokens
    in the tiny model's tokenizer, ~15,400 with OpenCode's default agent and tools)."""
    return {
        "lead": {"mode": "primary", "prompt": lead, "tools": {"*": False, "task": True}},
        "worker": {
            "mode": "subagent",
            "description": worker_description,
            "prompt": worker,
            "tools": {"*": False},
        },
        "explore": {"disable": True},
        "general": {"disable": True},
        "title": {"disable": True},
    }


def opencode_delegation_setup(task: TaskSpec) -> OpenCodeSetup:
    """The `opencode-delegation` family (harnesses/opencode_delegation.py): the prompts tiny-tools was
    drilled on, with the lead's message as `opencode run` gets it."""
    return OpenCodeSetup(
        message=opencode_delegation.user_message(task),
        agents=opencode_delegation.OPENCODE_AGENTS,
        default_agent=opencode_delegation.DEFAULT_AGENT,
    )


def opencode_reader_setup(task: TaskSpec) -> OpenCodeSetup:
    """The `opencode-reader` family (harnesses/opencode_reader.py): the lead of `opencode-delegation`,
    workers that read notes.txt and compact. `opencode-report` (harnesses/opencode_report.py) runs the same
    episodes under another reward."""
    return OpenCodeSetup(
        message=opencode_reader.user_message(task),
        agents=opencode_reader.OPENCODE_AGENTS,
        default_agent=opencode_reader.DEFAULT_AGENT,
        agent_context_limits={"worker": opencode_reader.WORKER_CONTEXT},
        files=opencode_reader.project_files(task),
    )


TASK_SETUPS: dict[str, Callable[[TaskSpec], OpenCodeSetup]] = {
    "delegation": delegation_setup,
    opencode_delegation.FAMILY: opencode_delegation_setup,
    opencode_reader.FAMILY: opencode_reader_setup,
    opencode_report.FAMILY: opencode_reader_setup,
}


def setup_for(task: TaskSpec, options: OpenCodeOptions) -> OpenCodeSetup:
    """The task family's setup with the run's overrides (`agent_context_limits` per agent over the
    family's); a family without one needs `message` (in the options or as the task's
    `params["message"]`)."""
    base = TASK_SETUPS[task.family](task) if task.family in TASK_SETUPS else None
    message = first_message(
        task, options.message, base.message if base else None,
        harness="OpenCode", module="opencode", option="opencode", error=OpenCodeSetupError,
    )  # fmt: skip
    agents = options.agents if options.agents is not None else (base.agents if base else {})
    default = options.default_agent or (base.default_agent if base else None)
    limits = {**(base.agent_context_limits if base else {}), **options.agent_context_limits}
    files = base.files if base else {}
    for path in files:
        check_project_path(task, path)
    return OpenCodeSetup(
        message=message, agents=agents, default_agent=default, agent_context_limits=limits, files=files
    )


def check_project_path(task: TaskSpec, path: str) -> None:
    """A family's file must stay inside the episode's project folder and leave opencode.json to grove."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts or path == "opencode.json":
        raise OpenCodeSetupError(
            f"task {task.task_id!r} of family {task.family!r}: project file {path!r}: expected a relative "
            "path inside the project folder (no '..', not opencode.json); fix the family's setup"
        )


def _timeouts(seconds: float | None) -> dict[str, int | bool]:
    """OpenCode's provider fetch gives up on a response whose headers take 5 minutes, or a stream silent for
    5 minutes, then re-sends the request. The gateway sends its headers when generation ends, and a call can
    queue longer than that behind a group's long prompts on a loaded engine: the re-sent request would find
    the first still generating (409) until OpenCode gave up. `false` switches either wait off (OpenCode
    1.18.33: `headerTimeout === false`, `chunkTimeout` not a positive number); the launch's own deadline
    still bounds the episode."""
    if seconds is None:
        return {"headerTimeout": False, "chunkTimeout": False}
    ms = max(1, round(seconds * 1000))
    return {"headerTimeout": ms, "chunkTimeout": ms}


def opencode_config(
    setup: OpenCodeSetup,
    base_url: str,
    token: str,
    *,
    launch: int,
    context_limit: int,
    output_limit: int,
    model: str = MODEL,
    agent_context_limits: Mapping[str, int] | None = None,
    request_timeout_s: float | None = None,
) -> dict[str, Any]:
    """The `opencode.json` of one launch (see the module docstring); `model`: the id the gateway serves.
    `agent_context_limits`: agents whose `limit.context` differs; each gets a model entry `<model>-<agent>`
    whose API id is still `model` (OpenCode sends `id`), with that limit, and uses it.
    `request_timeout_s`: OpenCode's wait for a response's headers and between chunks (None: no limit)."""
    models: dict[str, Any] = {
        model: {"name": model, "tool_call": True, "limit": {"context": context_limit, "output": output_limit}}
    }
    agents = {name: dict(body) for name, body in setup.agents.items()}
    for agent, limit in sorted((agent_context_limits or {}).items()):
        key = f"{model}-{agent}"
        models[key] = {
            "id": model, "name": key, "tool_call": True, "limit": {"context": limit, "output": output_limit}
        }  # fmt: skip
        agents[agent] = {**agents.get(agent, {}), "model": f"{PROVIDER}/{key}"}
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "grove",
                "options": {
                    "baseURL": base_url,
                    "apiKey": token,
                    "headers": {LAUNCH_HEADER: str(launch)},
                    **_timeouts(request_timeout_s),
                },
                "models": models,
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "share": "disabled",
        "autoupdate": False,
        "lsp": False,
        "agent": agents,
    }
    if setup.default_agent:
        config["default_agent"] = setup.default_agent
    return config


def opencode_env(home: str, path: str = SYSTEM_PATH) -> dict[str, str]:
    """The whole environment of an OpenCode process: its own HOME/XDG folders and offline switches."""
    return sandbox_env(home, path, **OFFLINE_ENV)


def opencode_argv(binary: str, message: str) -> list[str]:
    """`opencode run --pure --format json <message>`: one run, no external plugins, JSON events."""
    return [binary, "run", "--pure", "--format", "json", message]


def _error_text(event: Mapping[str, Any]) -> str:
    err = event.get("error") or event.get("part", {}).get("error") or event
    if isinstance(err, dict):
        raw = err.get("data")
        data = raw if isinstance(raw, dict) else {}
        return str(data.get("message") or err.get("message") or err.get("name") or json.dumps(err)[:500])
    return str(err)[:500]


def outcome_of_events(events: list[dict[str, Any]]) -> HarnessOutcome:
    """Final answer, each agent's last output and any error OpenCode reported (module docstring)."""
    root = next((e.get("sessionID") for e in events if e.get("sessionID")), None)
    texts: dict[str, list[str]] = {}  # message id -> its text parts, root session only
    order: list[str] = []
    tasks: list[tuple[str, str, str]] = []  # (part id: the order the calls were written, type, answer)
    errors: list[str] = []
    for event in events:
        part = event.get("part") or {}
        kind = event.get("type")
        if kind == "error":
            errors.append(_error_text(event))
        if event.get("sessionID") != root:
            continue
        if kind == "text" and part.get("text") is not None:
            mid = part.get("messageID", "")
            if mid not in texts:
                texts[mid] = []
                order.append(mid)
            texts[mid].append(part["text"])
        elif kind == "tool_use" and part.get("tool") == "task":
            state = part.get("state") or {}
            match = _TASK_RESULT.search(str(state.get("output") or ""))
            subagent_type = str((state.get("input") or {}).get("subagent_type") or "worker")
            if state.get("status") == "completed" and match:
                tasks.append((str(part.get("id") or ""), subagent_type, match.group("text")))
    final = "".join(texts[order[-1]]) if order else ""
    outputs: dict[str, list[str]] = {"parent": [final]} if order else {}
    # OpenCode reports a task when it ends (concurrent ones in any order); its part ids ascend in the
    # order the calls were written, which is the order subagents are numbered in
    tasks.sort(key=lambda t: t[0])
    for name, (_, _, text) in zip(subagent_names(t[1] for t in tasks), tasks, strict=True):
        outputs[name] = [text]
    failure = f"OpenCode reported: {errors[-1]}" if errors else None
    return HarnessOutcome(final_answer=final, outputs=outputs, failure=failure)
