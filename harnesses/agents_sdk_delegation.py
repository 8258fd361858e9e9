"""The `agents-sdk-delegation` program (harnesses/framework_delegation.py): `delegation` with the OpenAI
Agents SDK, run by the harness runner in its own process once per episode
(`harness: {kind: python, python: {entry: "harnesses.agents_sdk_delegation:run"}}`).

The lead agent has the worker agent as a tool (`as_tool`). It reads the two words and answers (the
delegating turn); then the program invokes the worker tool once per word, concurrently, exactly as the
SDK invokes a tool call of that response (a ToolContext whose tool call is an item of the lead's
response: harnesses/clients/agents_sdk.py reads the spawn link from it). The program drives the
delegation, as `delegation`'s native program does, because a small policy rarely writes a parseable
tool call; a tool call the policy does write is run by the SDK as usual. The lead then reads both
answers on its own history (a continuation) and answers. Identity comes from grove's ModelProvider.

Option `stream` (`harness.python.options.stream: true`): every run is streamed, as programs that show
progress run agents: the lead's turns with `Runner.run_streamed`, the worker tool's nested runs too (an
`as_tool(on_stream=...)` tool runs its agent streamed). The calls, identities, spawn links and rows are the
same as without it (docs/harnesses.md, "Streamed runs").
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, Runner
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from harnesses.clients.agents_sdk import GroveModelProvider
from harnesses.clients.program import HarnessContext
from harnesses.delegation import PARENT_SYSTEM, WORKER_SYSTEM

WORKER_TOOL = "worker"


def lead_agent(stream: bool = False) -> Agent:
    worker = Agent(name="Worker", instructions=WORKER_SYSTEM)
    tool = worker.as_tool(
        tool_name=WORKER_TOOL,
        tool_description="Repeats the word it is given.",
        on_stream=_ignore if stream else None,  # given: the nested run is streamed
    )
    return Agent(name="Lead", instructions=PARENT_SYSTEM, tools=[tool])


def _ignore(_event: Any) -> None:
    return None


async def run_agent(lead: Agent, task: Any, config: Any, stream: bool) -> Any:
    """`Runner.run`, or `Runner.run_streamed` with its events consumed to the end."""
    if not stream:
        return await Runner.run(lead, task, run_config=config)
    result = Runner.run_streamed(lead, task, run_config=config)
    async for _event in result.stream_events():
        pass
    return result


def tool_context(lead: Agent, config, item_id: str, call_id: str, word: str) -> ToolContext:
    """The context the SDK gives a tool call `call_id` of the response item `item_id`."""
    [tool] = lead.tools
    arguments = json.dumps({"input": f"Word:\n{word}"})
    call = ResponseFunctionToolCall(
        id=item_id, call_id=call_id, name=tool.name, arguments=arguments, type="function_call"
    )
    return ToolContext(
        context=None, tool_name=tool.name, tool_call_id=call_id, tool_arguments=arguments,
        tool_call=call, agent=lead, run_config=config,
    )  # fmt: skip


async def run(harness: HarnessContext) -> str:
    provider = GroveModelProvider(harness.episode, model_name=harness.model)
    words = list(harness.task["params"]["words"])
    stream = bool(harness.options.get("stream", False))
    lead, config = lead_agent(stream), provider.run_config()
    first = await run_agent(lead, "Words:\n" + "\n".join(words), config, stream)
    item_id = first.raw_responses[-1].response_id  # the lead's delegating call (x-grove-call-id)
    [tool] = lead.tools
    contexts = [tool_context(lead, config, item_id, f"call_w{i + 1}", w) for i, w in enumerate(words)]
    answers = await asyncio.gather(*(tool.on_invoke_tool(c, c.tool_arguments) for c in contexts))
    follow_up = [
        *first.to_input_list(),
        {"role": "user", "content": "Worker answers:\n" + "\n".join(answers)},
    ]
    second = await run_agent(lead, follow_up, config, stream)
    return str(second.final_output)
