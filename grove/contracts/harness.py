"""Contracts of the harness boundary: the task an episode attempts, who drives it (a native program, an
external harness, a harness process the run launches per episode: OpenCode, Claude Code, Codex or a
Python program), and what a launch reports.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grove.episodes import FailureKind


class TaskSpec(BaseModel):
    """One dataset item: a task family and the parameters of this instance."""

    model_config = ConfigDict(frozen=True)

    family: str
    task_id: str
    params: dict[str, Any] = Field(default_factory=dict)


HarnessKind = Literal["native", "external", "opencode", "claude-code", "codex", "python"]


# Kinds whose process the run owns: a `run_harness` activity on the harness queue launches it per episode
# (activities/harness.py); it talks to the episode through the gateway like a hand-run external harness.
RUNNER_KINDS: frozenset[str] = frozenset({"opencode", "claude-code", "codex", "python"})


# Kinds whose harness may close without outputs: the reward then reads each agent's last answer from the
# ledger (OpenCode's runner reads them from its events; Codex's events carry the lead's answer only).
LEDGER_OUTPUT_KINDS: frozenset[str] = frozenset({"external", "codex", "python"})


_ENTRY = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class OpenCodeOptions(BaseModel):
    """How the harness runner sets OpenCode up for each episode (harnesses/opencode.py writes its
    `opencode.json`). Agents and the first message come from the task family unless given here."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field("1.18.33", description="opencode-ai npm version (infra/opencode.sh installs it)")
    agents: dict[str, dict[str, Any]] | None = Field(
        None,
        description="opencode.json `agent` section (e.g. a restricted primary agent with only the `task` "
        "tool and a `worker` subagent); null: the task family's (harnesses/opencode.py TASK_SETUPS)",
    )
    default_agent: str | None = Field(None, description="opencode.json `default_agent`; null: the family's")
    message: str | None = Field(None, description="the first user message; null: the task family's")
    context_limit: int = Field(
        2048,
        ge=256,
        description="`limit.context` declared to OpenCode: it compacts a session when the usage grove "
        "reports reaches it minus min(20000, output limit); keep it well above OpenCode's fixed prompt "
        "or it loops",
    )
    output_limit: int | None = Field(
        None, ge=1, description="`limit.output` (OpenCode's max_tokens); null: the run's sampling.max_tokens"
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long OpenCode waits for a response to start, and between its chunks (its "
        "provider `headerTimeout` / `chunkTimeout`); null: no limit, the launch's deadline_s bounds it. "
        "The gateway answers when generation ends, so a call queued behind a GRPO group's long prompts "
        "can outlast OpenCode's own 5-minute default; OpenCode would then re-send it while the first is "
        "still generating, be refused (409) and give up: the episode fails",
    )
    agent_context_limits: dict[str, Annotated[int, Field(ge=256)]] = Field(
        default_factory=dict,
        description="`limit.context` of single agents (agent name -> tokens), e.g. {worker: 400} so that "
        "the subagents compact while the lead does not: each such agent gets a model entry of its own in "
        "opencode.json (the same served model) with this limit; the same rule as context_limit applies",
    )


class ClaudeCodeOptions(BaseModel):
    """How the harness runner sets stock Claude Code up for each episode (harnesses/claude_code.py builds
    its command line and environment). The first message, system prompt, tools and subagents come from
    the task family unless given here. Claude Code speaks the Anthropic Messages API: the gateway must
    serve `POST /episodes/<ref>/v1/messages` for these episodes to run."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(
        "2.1.332",
        description="@anthropic-ai/claude-code npm version (infra/claude_code.sh installs it); the request "
        "shape changes between versions, so grove is checked against one",
    )
    message: str | None = Field(None, description="the first user message; null: the task family's")
    system_prompt: str | None = Field(
        None, description="the lead's `--system-prompt`; null: the task family's (empty without one)"
    )
    tools: list[str] | None = Field(
        None,
        description="the lead's built-in tools (`--tools`, also approved up front), e.g. [Agent] or "
        "[Bash, Read, Edit, Agent]; keep Agent for subagents; null: the family's (else [Agent])",
    )
    agents: dict[str, dict[str, Any]] | None = Field(
        None,
        description="`--agents` JSON: custom subagents, name -> {description, prompt, tools?, model?}; "
        "null: the task family's (harnesses/claude_code.py TASK_SETUPS)",
    )
    output_limit: int | None = Field(
        None,
        ge=1,
        description="max_tokens of each request (CLAUDE_CODE_MAX_OUTPUT_TOKENS); null: the run's "
        "sampling.max_tokens",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long Claude Code waits for one response before it re-sends the request "
        "(API_TIMEOUT_MS; its own default 600 s); null: the launch's deadline_s. The gateway answers when "
        "generation ends, and a request re-sent meanwhile finds the first still generating",
    )
    max_context_tokens: int | None = Field(
        None,
        ge=256,
        description="the context size Claude Code compacts against (CLAUDE_CODE_MAX_CONTEXT_TOKENS): it "
        "summarises a context once the input tokens the gateway reports approach it; null: its own "
        "default window (no compaction in short episodes)",
    )


class CodexOptions(BaseModel):
    """How the harness runner sets stock Codex CLI up for each episode (harnesses/codex.py writes its
    `config.toml` and model catalog). The first message and instructions come from the task family unless
    given here."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field("0.171.0", description="@openai/codex npm version (infra/codex.sh installs it)")
    message: str | None = Field(None, description="the first user message; null: the task family's")
    instructions: str | None = Field(
        None,
        description="the base instructions of the served model's catalog entry (Codex sends them as the "
        "first developer message of every agent, subagents included); null: the task family's",
    )
    subagents: bool = Field(
        True,
        description="Codex's subagents (`[agents] enabled`): the multi_agent_v1 tools spawn_agent, "
        "send_input, wait_agent, close_agent, resume_agent (~9k characters of tool schemas per request)",
    )
    max_depth: int = Field(
        1,
        ge=1,
        description="`[agents] max_depth`: how deep agents may spawn agents; 1: the lead's subagents spawn "
        "none (Codex offers them no agent tools, only apply_patch and the shell). Subagents get the same "
        "base instructions as the lead, so a policy that delegates would otherwise delegate again in each",
    )
    shell: bool = Field(
        True,
        description="Codex's shell tools exec_command and write_stdin (~2.4k characters of schemas); false: "
        "the catalog entry's shell_type is disabled (apply_patch and, with subagents, the agent tools stay)",
    )
    context_window: int = Field(
        2048, ge=256, description="`context_window` of the catalog entry (Codex's view of the context)"
    )
    auto_compact_token_limit: int | None = Field(
        None,
        ge=1,
        description="`model_auto_compact_token_limit`: Codex compacts an agent's history (an ordinary "
        "request with no tools and a summary prompt) once the usage grove reports reaches it; null: "
        "Codex's own rule from context_window",
    )
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] = Field(
        "workspace-write",
        description="`sandbox_mode` of the commands the policy runs (approval policy is always `never`: "
        "nothing waits for a person); workspace-write: writes only inside the episode's project folder",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Codex's `stream_idle_timeout_ms` for the gateway's answers (the gateway answers when "
        "generation ends, so a call queued behind a GRPO group's prompts can be silent for minutes); "
        "null: Codex's default (300 s)",
    )


class PythonHarnessOptions(BaseModel):
    """A Python harness program the runner launches per episode (harnesses/python_harness.py): the
    function `entry` gets the episode's gateway URL, token, launch number and task, and returns the final
    answer (or {"final_answer", "outputs"}). It runs in its own interpreter, isolated like OpenCode."""

    model_config = ConfigDict(extra="forbid")

    entry: str | None = Field(
        None,
        pattern=_ENTRY,
        description="`package.module:function` importable in the harness process, e.g. "
        "harnesses.langgraph_delegation:run (a LangGraph program) or harnesses.agents_sdk_delegation:run",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="passed to the program as `harness.options` (its own settings)"
    )


class HarnessSpec(BaseModel):
    """Who drives the episode: a native program inside the workflow, an external harness (gateway), or
    a harness process the run launches per episode (`opencode`, `claude-code`, `codex`, `python`;
    activities/harness.py)."""

    model_config = ConfigDict(extra="forbid")

    kind: HarnessKind = Field(
        "native",
        description="native: a program run inside the episode workflow (harnesses/programs.py); "
        "external: a harness process that talks to the episode through the gateway, started by someone "
        "else (`grove episode start --external`); opencode: the run launches stock OpenCode per episode "
        "on the harness queue (activities/harness.py), talking through the gateway; claude-code: the same "
        "with stock Claude Code (its Anthropic Messages requests); codex: the same with stock Codex CLI "
        "(`codex exec`, the Responses API); python: the run "
        "launches a Python harness program per episode the same way (`python.entry`)",
    )
    program: str = Field(
        "delegation", description="native: the program's name in harnesses.programs.PROGRAMS"
    )
    max_turns: int = Field(4, ge=1, description="most model turns the parent agent may take")
    opencode: OpenCodeOptions = Field(
        default_factory=OpenCodeOptions, description="opencode: how each episode's OpenCode is configured"
    )
    claude_code: ClaudeCodeOptions = Field(
        default_factory=ClaudeCodeOptions,
        description="claude-code: how each episode's Claude Code is configured",
    )
    codex: CodexOptions = Field(
        default_factory=CodexOptions, description="codex: how each episode's Codex CLI is configured"
    )
    python: PythonHarnessOptions = Field(
        default_factory=PythonHarnessOptions, description="python: the program each episode runs"
    )
    deadline_s: float = Field(
        900.0,
        gt=0,
        description="launched harnesses: wall-clock limit of one launch (then its process group "
        "is killed and the episode closes as failed)",
    )
    heartbeat_timeout_s: float = Field(
        30.0,
        gt=0,
        description="launched harnesses: a runner silent this long is presumed dead; the launch "
        "is retried (relaunched, answered from the recorded calls while its requests match them)",
    )
    max_launches: int = Field(
        3, ge=1, description="launched harnesses: launches per episode (the first + relaunches)"
    )

    @model_validator(mode="after")
    def _python_needs_an_entry(self) -> HarnessSpec:
        if self.kind == "python" and self.python.entry is None:
            raise ValueError(
                "harness.kind is 'python' but harness.python.entry is not set: name the program's "
                "function as package.module:function (e.g. harnesses.langgraph_delegation:run)"
            )
        return self


class HarnessOutcome(BaseModel):
    """What the harness produced, in text: the reward function's input."""

    final_answer: str = ""
    outputs: dict[str, list[str]] = Field(default_factory=dict)  # agent -> selected completions' texts
    failure: str | None = None
    failure_kind: FailureKind | None = None  # who is to blame for `failure` (grove/episodes.py)


class HarnessRunResult(BaseModel):
    """What one launch of a harness process did (the episode's outcome went to the gateway's close)."""

    launch: int  # 1 for the first launch, n for the (n-1)th relaunch after a lost runner
    exit_code: int | None  # None: killed at its deadline
    wall_s: float
    events: int  # harness events read from its stdout (OpenCode `--format json`)
    failure: str | None = None  # what the close reported, if the launch failed
    already_closed: bool = False  # the episode was closed before this launch (nothing launched)


class HarnessHeartbeat(BaseModel):
    """The runner's heartbeat details (Temporal UI: pending activity): process, calls so far, last request."""

    launch: int
    pid: int | None
    elapsed_s: float
    calls: int  # calls the episode's ledger admitted so far (all agents)
    last_request: str | None  # ISO time (workflow clock) of the episode's last Update
    last_event: str | None  # the harness's last event type (OpenCode: step_start, tool_use, text, ...)
