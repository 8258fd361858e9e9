"""A LangGraph supervisor with two concurrent `Send` workers; the second worker compacts its history with
LangChain's SummarizationMiddleware. Only the two lines marked `grove` know about grove: identity, spawn
links, the summary call (auxiliary) and the rewritten history are inferred (harnesses/clients/langgraph.py).
When the graph is done, the program closes the episode and prints what grove recorded (accounting, rows,
agents).

    grove episode start --external --json          # prints base_url and token of a new episode
    export GROVE_BASE_URL=<base_url> GROVE_API_KEY=<token>
    python examples/langgraph_supervisor.py
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from harnesses.clients.langgraph import GroveGraphs

SUBTASKS = ("the parser", "the tests")
# LangChain's default summary prompt is ~1,400 tokens in the tiny model's tokenizer, more than its whole
# context (1,024 in the tests); a short one keeps the `<messages>` block LangChain documents.
SUMMARY_PROMPT = (
    "Summarize the conversation in one line.\n\n<messages>\nMessages to summarize:\n{messages}\n</messages>"
)


class State(TypedDict):
    task: str
    messages: list[AnyMessage]  # the supervisor's own history
    reports: Annotated[list[str], operator.add]  # one per worker, joined by the reducer


class WorkerInput(TypedDict):
    topic: str
    compact: bool


def build_graph(model: Any) -> Any:
    async def supervise(state: State) -> dict:
        history = state["messages"] or [
            SystemMessage("You are the lead. Split the task between two workers, then merge their reports."),
            HumanMessage(state["task"]),
        ]
        if state["reports"]:
            history = [*history, HumanMessage("Worker reports:\n" + "\n".join(state["reports"]))]
        reply = await model.ainvoke(history)
        return {"messages": [*history, reply]}

    def delegate(state: State) -> Any:
        if state["reports"]:
            return END
        return [Send("worker", WorkerInput(topic=t, compact=i == 1)) for i, t in enumerate(SUBTASKS)]

    async def worker(job: WorkerInput) -> dict:
        summarize = SummarizationMiddleware(
            model, trigger=("messages", 3), keep=("messages", 1), summary_prompt=SUMMARY_PROMPT
        )
        middleware = [summarize]
        agent = create_agent(
            model, system_prompt="You are a careful worker.", middleware=middleware if job["compact"] else []
        )
        first = await agent.ainvoke({"messages": [HumanMessage(f"Look at {job['topic']}.")]})
        second = await agent.ainvoke({"messages": [*first["messages"], HumanMessage("Write your report.")]})
        return {"reports": [second["messages"][-1].text]}

    graph = StateGraph(State)
    graph.add_node("supervise", supervise)
    graph.add_node("worker", worker)
    graph.add_edge(START, "supervise")
    graph.add_conditional_edges("supervise", delegate, ["worker", END])
    graph.add_edge("worker", "supervise")
    return graph.compile()


async def run(grove: GroveGraphs, task: str = "Fix the failing build.", max_tokens: int = 16) -> str:
    graph = build_graph(grove.chat_model(max_tokens=max_tokens))  # grove: a model bound to the episode
    state = await grove.ainvoke(graph, {"task": task, "messages": [], "reports": []})  # grove: its callbacks
    return state["messages"][-1].text


async def main() -> None:
    from harnesses.clients.report import episode_report

    grove = GroveGraphs.from_env()
    answer = await run(grove)
    closed = await grove.aclose(final_answer=answer, wait=True)
    print(f"answer    {answer!r}")
    print(episode_report(grove.episode, closed))


if __name__ == "__main__":
    asyncio.run(main())
