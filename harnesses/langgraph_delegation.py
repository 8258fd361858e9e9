"""The `langgraph-delegation` program (harnesses/framework_delegation.py): `delegation` as a LangGraph
supervisor graph, run by the harness runner in its own process once per episode
(`harness: {kind: python, python: {entry: "harnesses.langgraph_delegation:run"}}`).

The lead reads the two words and answers (the delegating turn); two `Send` tasks run the workers
concurrently, one word each; the second worker is an agent with LangChain's SummarizationMiddleware: it
first gets a warm-up turn, so when its word arrives its history holds three messages and the middleware
summarises the warm-up (an auxiliary call) and sends the word after the summary (a declared rewrite of
the worker's context); the lead then reads both answers and answers with both words. Identity, spawn
links, the summary and the rewrite are inferred by harnesses/clients/langgraph.py: the graph is plain.
Every request uses the run's sampling (no sampling parameters are sent).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from harnesses.clients.langgraph import GroveGraphs
from harnesses.clients.program import HarnessContext
from harnesses.delegation_words import PARENT_SYSTEM, WARM_UP, WORKER_SYSTEM

# LangChain's default summary prompt is ~1,400 tokens in the tiny model's tokenizer, more than its whole
# context; a short one, with the `<messages>` block LangChain documents.
SUMMARY_PROMPT = (
    "Summarize the conversation in one line.\n\n<messages>\nMessages to summarize:\n{messages}\n</messages>"
)


class State(TypedDict):
    words: list[str]
    messages: list[AnyMessage]  # the lead's own history
    answers: Annotated[list[tuple[int, str]], operator.add]  # (word index, worker's answer)


class WorkerJob(TypedDict):
    index: int
    word: str
    compact: bool


def build_graph(model: Any) -> Any:
    async def lead(state: State) -> dict:
        history = state["messages"] or [
            SystemMessage(PARENT_SYSTEM),
            HumanMessage("Words:\n" + "\n".join(state["words"])),
        ]
        if state["answers"]:
            answers = [text for _, text in sorted(state["answers"])]
            history = [*history, HumanMessage("Worker answers:\n" + "\n".join(answers))]
        reply = await model.ainvoke(history)
        return {"messages": [*history, reply]}

    def delegate(state: State) -> Any:
        if state["answers"]:
            return END
        return [
            Send("worker", WorkerJob(index=i, word=w, compact=i == 1)) for i, w in enumerate(state["words"])
        ]

    async def worker(job: WorkerJob) -> dict:
        ask = HumanMessage(f"Word:\n{job['word']}")
        if not job["compact"]:
            reply = await model.ainvoke([SystemMessage(WORKER_SYSTEM), ask])
            return {"answers": [(job["index"], reply.text)]}
        summarize = SummarizationMiddleware(
            model, trigger=("messages", 3), keep=("messages", 1), summary_prompt=SUMMARY_PROMPT
        )
        agent = create_agent(model, system_prompt=WORKER_SYSTEM, middleware=[summarize])
        first = await agent.ainvoke({"messages": [HumanMessage(WARM_UP)]})
        second = await agent.ainvoke({"messages": [*first["messages"], ask]})
        return {"answers": [(job["index"], second["messages"][-1].text)]}

    graph = StateGraph(State)
    graph.add_node("lead", lead)
    # a Send target's input is its Send payload (WorkerJob), which add_node's typing (the State) cannot say
    graph.add_node("worker", worker)  # type: ignore[arg-type]
    graph.add_edge(START, "lead")
    graph.add_conditional_edges("lead", delegate, ["worker", END])
    graph.add_edge("worker", "lead")
    return graph.compile()


async def run(harness: HarnessContext) -> str:
    grove = GroveGraphs(harness.episode)
    graph = build_graph(grove.chat_model(harness.model))
    words = list(harness.task["params"]["words"])
    state = await grove.ainvoke(graph, {"words": words, "messages": [], "answers": []})
    return state["messages"][-1].text
