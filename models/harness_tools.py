"""The tool JSON a harness sends, for the smol-agent drills (models/agent_drills.py): the Agents SDK's
function tools, handoffs and agents as tools and LangChain's function tools exactly as those libraries
convert them (tests/models/test_agent_drills.py compares), Claude Code's and Codex's tools shortened and
synthetic in their wording, real in their structure. Pure functions; standard library only.
"""

from __future__ import annotations

import random
import re
from typing import Any

# agents.extensions.handoff_prompt.RECOMMENDED_PROMPT_PREFIX (openai-agents);
# `prompt_with_handoff_instructions` puts two newlines and the agent's own instructions after it
SDK_HANDOFF_PROMPT = (
    "# System context\nYou are part of a multi-agent system called the Agents SDK, designed to make agent "
    "coordination and execution easy. Agents uses two primary abstraction: **Agents** and **Handoffs**. An "
    "agent encompasses instructions and tools and can hand off a conversation to another agent when "
    "appropriate. Handoffs are achieved by calling a handoff function, generally named "
    "`transfer_to_<agent_name>`. Transfers between agents are handled seamlessly in the background; do not "
    "mention or draw attention to these transfers in your conversation with the user.\n"
)


def function_tool(name: str, description: str, parameters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters, **extra},
    }


def langchain_tool(name: str, description: str, required: list[str], optional: list[str]) -> dict[str, Any]:
    """What LangChain's `convert_to_openai_tool` makes of
    `@tool def name(<required>: str, <optional>: str = "")`
    with `description` as its docstring."""
    props: dict[str, Any] = {p: {"type": "string"} for p in required}
    props |= {p: {"default": "", "type": "string"} for p in optional}
    return function_tool(name, description, {"properties": props, "required": required, "type": "object"})


def _title(param: str) -> str:
    return " ".join(part.capitalize() for part in param.split("_"))


def sdk_function_tool(
    name: str, description: str, required: list[str], optional: list[str]
) -> dict[str, Any]:
    """What the Agents SDK's chat-completions converter makes of `@function_tool` on the same function."""
    props: dict[str, Any] = {p: {"title": _title(p), "type": "string"} for p in required}
    props |= {p: {"default": "", "title": _title(p), "type": "string"} for p in optional}
    params = {
        "properties": props,
        "required": list(props),
        "title": f"{name}_args",
        "type": "object",
        "additionalProperties": False,
    }
    return function_tool(name, description, params, strict=True)


def handoff_tool(agent_name: str, handoff_description: str) -> dict[str, Any]:
    """The Agents SDK's handoff to an agent named `agent_name` (`handoff(agent)`, converted)."""
    params = {"additionalProperties": False, "type": "object", "properties": {}, "required": []}
    description = f"Handoff to the {agent_name} agent to handle the request. {handoff_description}"
    return function_tool(tool_name_of(f"transfer_to_{agent_name}"), description, params, strict=True)


def agent_as_tool(tool_name: str, description: str) -> dict[str, Any]:
    """The Agents SDK's `agent.as_tool(tool_name=..., tool_description=...)`, converted."""
    params = {
        "description": "Default input schema for agent-as-tool calls.",
        "properties": {"input": {"title": "Input", "type": "string"}},
        "required": ["input"],
        "title": "AgentAsToolInput",
        "type": "object",
        "additionalProperties": False,
    }
    return function_tool(tool_name, description, params, strict=True)


def tool_name_of(name: str) -> str:
    """The Agents SDK's function-style name (agents.util._transforms.transform_string_function_style)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", re.sub(r"\s", "_", name)).lower()


_AGENT_HEAD = (
    "Launch a new agent to handle complex, multi-step tasks autonomously.\n\nThe Agent tool launches "
    "specialized agents (subprocesses) that autonomously handle complex tasks. Each agent type has specific "
    "capabilities and tools available to it.\n\nAvailable agent types and the tools they have access to:\n"
)
_AGENT_TAIL = (
    "\n\nWhen using the Agent tool, specify a subagent_type parameter to select which agent type to use.\n\n"
    "Usage notes:\n- Always include a short description (3-5 words) summarizing what the agent will do\n"
    "- Launch multiple agents concurrently whenever possible, to maximize performance\n- When the agent is "
    "done, it will return a single message back to you. The result returned by the agent is not visible to "
    "the user. To show the user the result, you should send a text message back to the user with a concise "
    "summary of the result.\n- Provide clear, detailed prompts so the agent can work autonomously."
)


def claude_code_tools(
    listing: list[tuple[str, str, str]], rng: random.Random, *, compact: bool = False
) -> list[dict[str, Any]]:
    """Claude Code's tools as a request with `--tools Bash,Read,Edit,Agent` carries them, shortened: the
    Agent tool's schema (`description`, `prompt`, `subagent_type`, `model`, `run_in_background`, `name`)
    with the agent types listed in its description."""
    agents = "\n".join(f"- {n}: {d} (Tools: {t})" for n, d, t in listing)
    agent = function_tool(
        "Agent",
        _AGENT_HEAD + agents + _AGENT_TAIL,
        {
            "type": "object",
            "properties": {
                "description": {
                    "description": "A short (3-5 word) description of the task",
                    "type": "string",
                },
                "prompt": {"description": "The task for the agent to perform", "type": "string"},
                "subagent_type": {
                    "description": "The type of specialized agent to use for this task",
                    "type": "string",
                },
                "model": {
                    "description": "Optional model override for this agent.",
                    "type": "string",
                    "enum": ["sonnet", "opus", "haiku"],
                },
                "run_in_background": {
                    "description": "Set to true to run this agent in the background.",
                    "type": "boolean",
                },
                "name": {"description": "Optional name for the spawned agent.", "type": "string"},
            },
            "required": ["description", "prompt"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    )
    others = [
        function_tool(
            "Bash",
            "Executes a given bash command and returns its output.",
            {
                "type": "object",
                "properties": {
                    "command": {"description": "The command to execute", "type": "string"},
                    "timeout": {
                        "description": "Optional timeout in milliseconds (max 600000)",
                        "type": "number",
                    },
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        ),
        function_tool(
            "Edit",
            "Performs exact string replacements in files.",
            {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                },
                "required": ["file_path", "old_string", "new_string"],
                "additionalProperties": False,
            },
        ),
        function_tool(
            "Read",
            "Reads a file from the local filesystem.",
            {
                "type": "object",
                "properties": {
                    "file_path": {"description": "The absolute path to the file to read", "type": "string"}
                },
                "required": ["file_path"],
                "additionalProperties": False,
            },
        ),
    ]
    if compact:
        props = agent["function"]["parameters"]["properties"]
        agent["function"]["description"] = "Launch a new agent.\n\nAgent types:\n" + agents
        agent["function"]["parameters"]["properties"] = {
            k: props[k] for k in ("description", "prompt", "subagent_type")
        }
        return [agent]
    return [agent, *rng.sample(others, rng.randint(0, 3))]


def claude_code_env(folder: str, rng: random.Random) -> str:
    """The environment block Claude Code sends as a `role: system` message (shortened)."""
    return (
        f"<env>\nWorking directory: {folder}\nIs directory a git repo: {rng.choice(('Yes', 'No'))}\n"
        "Platform: linux\n"
        f"Today's date: {rng.randint(2024, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}\n</env>"
    )


def codex_tools(rng: random.Random, *, compact: bool = False) -> list[dict[str, Any]]:
    """Codex's tools as the gateway offers them to the policy: function tools, the `multi_agent_v1`
    namespace's members by their own names (the gateway adds the namespace back to a call), shortened."""
    spawn = function_tool(
        "spawn_agent",
        "Spawn a sub-agent for a well-scoped task. Returns the agent id and a "
        "nickname; you are notified when it finishes.",
        {
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "Initial plain-text task for the new agent."},
                "fork_context": {
                    "type": "boolean",
                    "description": "Fork the current thread history into the agent.",
                },
                "model": {"type": "string", "description": "Optional model override."},
                "reasoning_effort": {"type": "string", "description": "Optional reasoning effort override."},
            },
            "required": [],
            "additionalProperties": False,
        },
    )
    others = [
        function_tool(
            "exec_command",
            "Runs a command in a PTY, returning output or a session ID.",
            {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string", "description": "Shell command to execute."},
                    "workdir": {"type": "string", "description": "Optional working directory."},
                },
                "required": ["cmd"],
                "additionalProperties": False,
            },
        ),
        function_tool(
            "wait_agent",
            "Wait for agents to reach a final status.",
            {
                "type": "object",
                "properties": {
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "timeout_ms": {"type": "number"},
                },
                "required": ["ids"],
                "additionalProperties": False,
            },
        ),
        function_tool(
            "send_input",
            "Send a message to an existing agent.",
            {
                "type": "object",
                "properties": {"id": {"type": "string"}, "message": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": False,
            },
        ),
        function_tool(
            "close_agent",
            "Close an agent when it is no longer needed.",
            {
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": False,
            },
        ),
    ]
    if compact:
        spawn["function"]["description"] = "Spawn a sub-agent."
        spawn["function"]["parameters"]["properties"] = {"message": {"type": "string"}}
        others = [o for o in others if o["function"]["name"] == "exec_command"]
    tools = [*rng.sample(others, rng.randint(0, len(others))), spawn]
    rng.shuffle(tools)
    return tools
