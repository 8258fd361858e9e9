"""The `agents-sdk-delegation` program (harnesses/framework_delegation.py): `delegation` with the OpenAI
Agents SDK, run by the harness runner in its own process once per episode
(`harness: {kind: python, python: {entry: "harnesses.agents_sdk_delegation:run"}}`).

The lead agent has two worker tools: the worker agent as a tool (`as_tool`), and a worker with a
history (a `function_tool` that runs the worker agent itself, the SDK's custom agent-tool). It reads the
two words and answers (the delegating turn); then the program invokes one tool per word, concurrently,
exactly as the SDK invokes a tool call of that response (a ToolContext whose tool call is an item of the
lead's response: harnesses/clients/agents_sdk.py reads the spawn link from it). The worker with a
history first gets a warm-up turn, then its word after that turn, under a summarising
`call_model_input_filter` (SummaryFilter): its history now holds three items, so the filter has a
summariser agent summarise the warm-up (an auxiliary call) and sends the word after the summary (a
declared rewrite of the worker's context), as LangChain's SummarizationMiddleware does in the LangGraph
program. The program drives the delegation, as `delegation`'s native program does, because a small
policy rarely writes a parseable tool call; a tool call the policy does write is run by the SDK as usual.
The lead then reads both answers on its own history (a continuation) and answers. Identity, spawn links,
the summary and the rewrite come from grove's ModelProvider: the program is plain Agents SDK code.

Option `stream` (`harness.python.options.stream: true`): every run is streamed, as programs that show
progress run agents: the lead's turns with `Runner.run_streamed`, the worker tool's nested runs too (an
`as_tool(on_stream=...)` tool runs its agent streamed) and the worker with a history's runs. The calls,
identities, spawn links and rows are the same as without it (docs/harnesses.md, "Streamed runs").
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, FunctionTool, Runner, TResponseInputItem, function_tool
from agents.run_config import CallModelData, ModelInputData, RunConfig
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall

from harnesses.clients import ROOT_AGENT
from harnesses.clients.agents_sdk import GroveModelProvider
from harnesses.clients.program import HarnessContext
from harnesses.delegation_words import PARENT_SYSTEM, WARM_UP, WORKER_SYSTEM

WORKER_TOOL = "worker"
MEMORY_TOOL = "worker_with_memory"
SUMMARY_INSTRUCTIONS = "Summarize the conversation in one line."


class SummaryFilter:
    """A `call_model_input_filter` that compacts: once the history holds `trigger` items or more, all but
    the last `keep` are replaced by one user message with a summary that `summarizer` writes. Each set of
    older items is summarised once (a turn sent again reuses its summary); a later turn of a longer
    history gets a new summary, so a new rewrite (the worker here answers in one turn; a filter that keeps
    its first summary in front of the later items, as tests/harnesses/test_agents_sdk_e2e.py's does,
    continues the rewritten context instead)."""

    def __init__(self, summarizer: Agent, config: RunConfig, trigger: int = 3, keep: int = 1) -> None:
        self.summarizer, self.config, self.trigger, self.keep = summarizer, config, trigger, keep
        self._summaries: dict[str, str] = {}

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        items = data.model_data.input
        if len(items) < self.trigger:
            return data.model_data
        older, recent = items[: -self.keep], items[-self.keep :]
        key = json.dumps(older, sort_keys=True, default=str)
        if key not in self._summaries:
            asked = "Messages to summarize:\n" + "\n".join(transcript_line(i) for i in older)
            result = await Runner.run(self.summarizer, asked, run_config=self.config)
            self._summaries[key] = str(result.final_output)
        summary: TResponseInputItem = {
            "role": "user",
            "content": f"Summary of the conversation:\n{self._summaries[key]}",
        }
        return ModelInputData(input=[summary, *recent], instructions=data.model_data.instructions)


def transcript_line(item: Any) -> str:
    """`role: text` of an input item (a user message, or an assistant message's output text)."""
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    role = item.get("role", item.get("type", "item")) if isinstance(item, dict) else type(item).__name__
    return f"{role}: {content if isinstance(content, str) else ''}"


def memory_worker_tool(worker: Agent, provider: GroveModelProvider, stream: bool) -> FunctionTool:
    """A worker with a history: each invocation runs `worker` on a warm-up turn, then on its word after
    that turn, under SummaryFilter (a custom agent-tool: the tool runs the agent itself)."""
    summarizer = Agent(name="Summarizer", instructions=SUMMARY_INSTRUCTIONS)

    @function_tool(
        name_override=MEMORY_TOOL, description_override="Repeats the word it is given, after a warm-up."
    )
    async def worker_with_memory(input: str) -> str:  # `input`: the `as_tool` worker's argument name
        config = provider.run_config(call_model_input_filter=SummaryFilter(summarizer, provider.run_config()))
        first = await run_agent(worker, WARM_UP, config, stream)
        second = await run_agent(
            worker, [*first.to_input_list(), {"role": "user", "content": input}], config, stream
        )
        return str(second.final_output)

    return worker_with_memory


def lead_agent(provider: GroveModelProvider, stream: bool = False) -> Agent:
    worker = Agent(name="Worker", instructions=WORKER_SYSTEM)
    tool = worker.as_tool(
        tool_name=WORKER_TOOL,
        tool_description="Repeats the word it is given.",
        on_stream=_ignore if stream else None,  # given: the nested run is streamed
    )
    return Agent(
        name="Lead", instructions=PARENT_SYSTEM, tools=[tool, memory_worker_tool(worker, provider, stream)]
    )


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


def _function_tools(agent: Agent) -> list[FunctionTool]:
    """The agent's tools, each a function tool (the lead's workers: `as_tool` and `function_tool`)."""
    tools = [t for t in agent.tools if isinstance(t, FunctionTool)]
    if len(tools) != len(agent.tools):
        others = sorted(type(t).__name__ for t in agent.tools if not isinstance(t, FunctionTool))
        raise TypeError(f"agent {agent.name!r} has tools that are not function tools: {others}")
    return tools


def tool_context(
    lead: Agent, tool: FunctionTool, config, item_id: str, call_id: str, word: str
) -> ToolContext:
    """The context the SDK gives a tool call `call_id` of `tool` in the response item `item_id`."""
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
    # The task family's reward and its parent-only baseline read the lead as `parent` (ROOT_AGENT).
    lead, config = lead_agent(provider, stream), provider.run_config(root_agent=ROOT_AGENT)
    first = await run_agent(lead, "Words:\n" + "\n".join(words), config, stream)
    item_id = first.raw_responses[-1].response_id  # the lead's delegating call (x-grove-call-id)
    # one word per tool, the second to the worker with a history (the one that compacts)
    calls = [
        (tool, tool_context(lead, tool, config, item_id, f"call_w{i + 1}", w))
        for i, (tool, w) in enumerate(zip(_function_tools(lead), words, strict=True))
    ]
    answers = await asyncio.gather(*(tool.on_invoke_tool(c, c.tool_arguments) for tool, c in calls))
    follow_up = [
        *first.to_input_list(),
        {"role": "user", "content": "Worker answers:\n" + "\n".join(answers)},
    ]
    second = await run_agent(lead, follow_up, config, stream)
    return str(second.final_output)
