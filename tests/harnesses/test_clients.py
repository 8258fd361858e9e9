"""Unit tests of the harness-side clients (harnesses/clients/): light imports, the header names
(grove/headers.py, shared with the gateway), header-safe agent names, and the LangGraph identity rules
on LangGraph's own metadata."""

from __future__ import annotations

import operator
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

import harnesses.clients as clients
from gateway.pipeline import identity as gw
from grove import headers
from grove.receipts import AUXILIARY_KINDS
from harnesses.clients import Episode, EpisodeConfigError, header_safe
from harnesses.clients.langgraph import GroveGraphs, UnknownCallKindError, summary_text
from tests.bounds import PROCESS_WAIT

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:9/episodes/cnVuL3MwMDAwMDEvdDAvZzA/v1"
HEAVY = ("torch", "vllm", "temporalio", "transformers", "numpy", "gateway", "workflows", "trainer")


def test_clients_import_without_grove_or_heavy_dependencies():
    code = (
        "import sys\n"
        "import harnesses.clients, harnesses.clients.langgraph, harnesses.clients.agents_sdk\n"
        "import harnesses.clients.program\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        # of grove itself, only the header names (grove/headers.py: stdlib only)
        "heavy += [m for m in sys.modules if m.startswith('grove.') and m != 'grove.headers']\n"
        "print(','.join(sorted(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
        check=True,
    )
    assert out.stdout.strip() == "", f"imported at import time: {out.stdout.strip()}"


def test_every_header_name_is_the_documented_one():
    """grove/headers.py is the one definition the clients and the gateway use: each name is documented in
    docs/gateway.md and every `x-grove-*` header the docs mention is defined there."""
    defined = {v for k, v in vars(headers).items() if k.endswith("_HEADER")}
    documented = set()
    for doc in ("gateway.md", "harnesses.md"):
        documented |= set(re.findall(r"x-grove-[a-z]+(?:-[a-z]+)*", (ROOT / "docs" / doc).read_text()))
    assert defined == documented
    gateway_md = (ROOT / "docs" / "gateway.md").read_text()
    assert all(name in gateway_md for name in defined)
    assert clients.ROOT_AGENT == gw.DEFAULT_AGENT
    # the clients' call kinds are the receipts' auxiliary kinds, which the gateway's header accepts
    assert set(clients.AUXILIARY_KINDS) == {k.value for k in AUXILIARY_KINDS}


NAMES = ["Research agent", "billing.v2", "a:b/c", "ünïcode", "  ", "x" * 200, "worker-1", "plain_name", "-"]


@pytest.mark.parametrize("name", NAMES)
def test_header_safe_is_the_gateways_canonical_agent_and_passes_its_checks(name):
    safe = header_safe(name)
    assert safe == gw.canonical_agent(name)
    assert gw.header_value({gw.AGENT_HEADER: safe}, gw.AGENT_HEADER) == safe
    assert gw.header_value(
        {gw.CONTEXT_HEADER: gw.aux_agent(safe, "aux") + ".0"}, gw.CONTEXT_HEADER, gw.ID_PATTERN
    )


def test_header_safe_keeps_safe_names_and_distinct_names_distinct():
    assert header_safe("worker-1") == "worker-1"
    names = ["Research agent", "Research_agent", "Research.agent", "Research-agent", "x" * 96, "x" * 97]
    assert len({header_safe(n) for n in names}) == len(names)


def test_a_launched_harness_sends_its_launch_with_every_request():
    env = {"GROVE_BASE_URL": BASE, "GROVE_API_KEY": "t", "GROVE_LAUNCH": "3"}
    episode = Episode.from_env(env)
    assert episode.launch == 3 and episode.headers == {"x-grove-launch": "3"}
    model = GroveGraphs(episode).chat_model("m", default_headers={"x-mine": "1"})
    assert model.default_headers == {"x-grove-launch": "3", "x-mine": "1"}
    from harnesses.clients.agents_sdk import GroveModelProvider

    assert GroveModelProvider(episode).client(episode).default_headers["x-grove-launch"] == "3"
    assert Episode.from_env({"GROVE_BASE_URL": BASE, "GROVE_API_KEY": "t"}).headers == {}


def test_episode_needs_an_episode_url_and_token():
    with pytest.raises(EpisodeConfigError, match="GROVE_BASE_URL"):
        Episode.from_env({})
    with pytest.raises(EpisodeConfigError, match="episodes/<episode ref>/v1"):
        Episode("http://127.0.0.1:9/v1", "tok")
    with pytest.raises(EpisodeConfigError, match="token is empty"):
        Episode(BASE, "")
    ep = Episode.from_env({"OPENAI_BASE_URL": BASE + "/", "OPENAI_API_KEY": "tok"})
    assert ep.close_url == BASE.removesuffix("/v1") + "/close"


def md(ns: str, node: str, path: tuple, step: int = 1) -> dict:
    return {
        "langgraph_checkpoint_ns": ns,
        "langgraph_node": node,
        "langgraph_path": path,
        "langgraph_step": step,
    }


def test_langgraph_tasks_map_to_parent_and_numbered_workers_spawned_by_the_parents_last_call():
    g = GroveGraphs(Episode(BASE, "tok"))
    assert g.task_identity({}) == ("parent", None)  # outside any graph
    assert g.task_identity(md("supervise:aa", "supervise", ("__pregel_pull", "supervise"))) == (
        "parent",
        None,
    )
    g.episode.record({"x-grove-call-id": "parent.0.c0", "x-grove-agent": "parent"})
    # a model call made in the Send task itself, and one nested in an agent inside another Send task
    assert g.task_identity(md("worker:bb", "worker", ("__pregel_push", 0, False), 2)) == (
        "worker-1",
        "parent.0.c0",
    )
    g.tracker.on_chain_start({}, {}, metadata=md("worker:cc", "worker", ("__pregel_push", 1, False), 2))
    nested = md("worker:cc|model:dd", "model", ("__pregel_pull", "model"))
    assert g.task_identity(nested) == ("worker-2", "parent.0.c0")
    # later calls of the same tasks keep their agent and spawner, whatever the parent did since
    g.episode.record({"x-grove-call-id": "parent.0.c1", "x-grove-agent": "parent"})
    assert g.task_identity(md("worker:cc|model:ee", "model", ("__pregel_pull", "model"))) == (
        "worker-2",
        "parent.0.c0",
    )
    assert g.task_identity(md("supervise:ff", "supervise", ("__pregel_pull", "supervise"), 3)) == (
        "parent",
        None,
    )


class SendState(TypedDict):
    named: Annotated[list, operator.add]  # (job index, agent) from each Send task


async def test_send_workers_are_numbered_in_send_order_whichever_reaches_the_model_first():
    """A relaunched program is answered from the recorded calls only if its agents keep their names
    (gateway/pipeline/launch_records.py): with grove's callbacks, `Send` task i is `worker-{i+1}` even when
    the tasks reach their model calls in the opposite order (each waits here until the next one has
    called)."""
    import asyncio

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    g = GroveGraphs(Episode(BASE, "tok"))
    called = [asyncio.Event() for _ in range(4)]
    called[3].set()  # the last job waits for nobody

    def fan(state: SendState):
        return END if state["named"] else [Send("worker", {"i": i}) for i in range(3)]

    async def worker(job: dict, config) -> dict:
        await called[job["i"] + 1].wait()  # job 2 "calls the model" first, then 1, then 0
        agent, _ = g.task_identity(config["metadata"])
        called[job["i"]].set()
        return {"named": [(job["i"], agent)]}

    graph = StateGraph(SendState)
    graph.add_node("lead", lambda state: {})
    graph.add_node("worker", worker)
    graph.add_edge(START, "lead")
    graph.add_conditional_edges("lead", fan, ["worker", END])
    graph.add_edge("worker", "lead")
    out = await asyncio.wait_for(g.ainvoke(graph.compile(), {"named": []}), 60)
    assert sorted(out["named"]) == [(0, "worker-1"), (1, "worker-2"), (2, "worker-3")]


def test_summarization_call_is_its_agents_summary_and_a_new_summary_is_declared_once():
    g = GroveGraphs(Episode(BASE, "tok"))
    prompt = [HumanMessage("<role>\nContext Extraction Assistant\n</role> ...")]
    assert g.headers_for("worker-1", "parent.0.c0", prompt, {"lc_source": "summarization"}) == {
        "x-grove-agent": "worker-1",
        "x-grove-call-kind": "summary",
    }
    # a graph's own summary step marks its model run; a title likewise; an unknown kind is refused
    own = g.headers_for("worker-1", "parent.0.c0", prompt, {"grove_call_kind": "summary"})
    assert own == {"x-grove-agent": "worker-1", "x-grove-call-kind": "summary"}
    assert g.headers_for("parent", None, prompt, {"grove_call_kind": "title"})["x-grove-call-kind"] == "title"
    with pytest.raises(UnknownCallKindError, match="'summarize' is not an auxiliary call kind"):
        g.headers_for("parent", None, prompt, {"grove_call_kind": "summarize"})
    summary = HumanMessage(
        "Here is a summary of the conversation to date:\n\nS1",
        additional_kwargs={"lc_source": "summarization"},
    )
    history = [SystemMessage("sys"), summary, HumanMessage("Write your report.")]
    assert summary_text(history) == summary.text
    first = g.headers_for("worker-1", "parent.0.c0", history, {})
    assert first == {"x-grove-agent": "worker-1", "x-grove-spawned-by": "parent.0.c0", "x-grove-rewrite": "1"}
    assert g.headers_for("worker-1", "parent.0.c0", history, {}) == first  # not answered yet: a resend
    g.after("worker-1", first, history, {"x-grove-call-id": "worker-1.1.c0", "x-grove-agent": "worker-1"})
    more = [*history, AIMessage("ok"), HumanMessage("more")]
    assert g.headers_for("worker-1", "parent.0.c0", more, {}) == {"x-grove-agent": "worker-1"}
    # the same text typed by a user (no lc_source marker) is no summary
    typed = [SystemMessage("sys"), HumanMessage(summary.text), HumanMessage("x")]
    assert summary_text(typed) is None and "x-grove-rewrite" not in g.headers_for("parent", None, typed, {})


def test_call_ids_are_read_where_langchain_puts_response_headers():
    from langchain_core.outputs import ChatGeneration, ChatResult

    from harnesses.clients.langgraph import GroveChatOpenAI

    headers = {"x-grove-call-id": "parent.0.c0", "x-grove-agent": "parent"}
    fresh = ChatResult(
        generations=[ChatGeneration(message=AIMessage("a"), generation_info={"headers": headers})]
    )
    merged = ChatResult(
        generations=[ChatGeneration(message=AIMessage("a", response_metadata={"headers": headers}))]
    )
    assert GroveChatOpenAI._response_headers(fresh) == headers == GroveChatOpenAI._response_headers(merged)
    g = GroveGraphs(Episode(BASE, "tok"))
    g.after("parent", {"x-grove-agent": "parent"}, [], GroveChatOpenAI._response_headers(fresh))
    assert g.episode.last_call("parent") == "parent.0.c0"


async def test_a_streamed_run_without_the_filters_identity_is_refused_before_any_request():
    """Inside a Temporal workflow the SDK resolves a streamed turn's model settings before grove's input
    filter runs: the activity's call names its episode but no agent. It must fail naming the fix, not
    reach the gateway as `parent` (the episode's URL here has no server: a request would fail otherwise)."""
    from agents import ModelSettings
    from agents.models.interface import ModelTracing

    from harnesses.clients.agents_sdk import EPISODE_ARG, AgentsConfigError, GroveModelProvider

    settings = ModelSettings(
        extra_args={EPISODE_ARG: {"base_url": "http://127.0.0.1:9/episodes/e/v1", "api_key": "t"}}
    )
    stream = (
        GroveModelProvider()
        .get_model("m")
        .stream_response(None, "hi", settings, [], None, [], ModelTracing.DISABLED)
    )
    with pytest.raises(AgentsConfigError, match="Runner.run in workflows"):
        await anext(stream)
