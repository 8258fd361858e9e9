"""LangChain / LangGraph on grove: a chat model bound to an episode that names its agent by itself.

    grove = GroveGraphs.from_env()                 # $GROVE_BASE_URL, $GROVE_API_KEY
    model = grove.chat_model(max_tokens=64)        # a langchain_openai.ChatOpenAI
    ... build the graph with `model` (nodes, Send, create_agent, SummarizationMiddleware) ...
    out = await grove.ainvoke(graph, inputs)       # graph.ainvoke with grove's callbacks in its config
    await grove.aclose(final_answer=...)

What each request carries, read from LangGraph's run config (the metadata LangChain hands every model
run) and the responses' headers; nothing in the graph mentions grove:

- agent: a LangGraph task reached by `Send` (a push task) is a worker `{node}-{n}` (n counts that node's push
  tasks in the order they start: the order of the `Send`s, when the graph runs with grove's callbacks
  (`ainvoke`, `config()`); without them, the order of their first model calls); every other task belongs to
  the root agent `parent`. Names that do not depend on which task reaches the model first are what lets a
  relaunched program be answered from the recorded calls (gateway/pipeline/launch_records.py). Model calls
  nested in a subgraph or in an agent invoked inside the node belong to the outermost task (the first segment
  of `checkpoint_ns`); grove's callback handler (`config()`, `invoke`, `ainvoke`) tells which outer tasks were
  pushed.
- spawn link: a worker's requests name `parent`'s last call (`x-grove-call-id` of the last response
  the parent got before the worker's first call) in `x-grove-spawned-by`, until the worker's first
  call is answered (later requests continue or rewrite the worker's own context).
- SummarizationMiddleware: its summary call (run metadata `lc_source: summarization`) is the summary
  of its agent's context (`x-grove-call-kind: summary`: trained when the run trains summaries); the
  first request whose history starts with a new summary message (`lc_source: summarization` in the
  message's additional kwargs) declares the rewrite (`x-grove-rewrite: 1`), later requests of that
  history continue it.
- A graph's own summary step: give its model run the metadata `grove_call_kind: summary`
  (`model.with_config(metadata={"grove_call_kind": "summary"})`; `title` and `auxiliary` likewise mark
  calls never trained) and put the summary in a HumanMessage with `additional_kwargs={"lc_source":
  "summarization"}` at the start of the rewritten history, as the middleware does.
- `model.for_agent("writer", spawned_by=...)` names an agent explicitly (e.g. a graph with two
  model-calling nodes that keep separate histories, or workers spawned by a worker).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import Field

from grove.headers import AGENT_HEADER, KIND_HEADER, REWRITE_HEADER, SPAWNED_BY_HEADER
from harnesses.clients import AUXILIARY_KINDS, ROOT_AGENT, SUMMARY, Episode, header_safe

SERVED_MODEL = "grove-served-model"  # placeholder until the first request asks the gateway
SUMMARY_SOURCE = "summarization"  # LangChain's `lc_source` of SummarizationMiddleware's call and message
KIND_METADATA = "grove_call_kind"  # run metadata a graph's own auxiliary step sets (module docstring)
_PUSH = "__pregel_push"


class UnknownCallKindError(ValueError):
    """A model run whose `grove_call_kind` metadata names no auxiliary call kind."""


class GroveGraphs:
    """The episode plus what grove learns while a graph runs: which outer tasks are workers, each
    task's agent and spawner, the summaries already declared as rewrites."""

    def __init__(self, episode: Episode, *, root_agent: str = ROOT_AGENT) -> None:
        self.episode = episode
        self.root_agent = root_agent
        self._lock = threading.Lock()
        self._pushed: dict[str, str] = {}  # outer task ns -> worker agent, for tasks reached by Send
        self._tasks: dict[str, tuple[str, str | None]] = {}  # outer task ns -> (agent, spawned_by)
        self._workers: Counter[str] = Counter()  # node -> push tasks named so far
        self._declared: dict[str, str] = {}  # agent -> summary text its rewrite was declared for
        self._model_name: str | None = None
        self.tracker = _TaskTracker(self)

    @classmethod
    def from_env(cls, **kwargs: Any) -> GroveGraphs:
        return cls(Episode.from_env(), **kwargs)

    # ------------------------------------------------------------------------------- user API

    def chat_model(self, model: str | None = None, **kwargs: Any) -> GroveChatOpenAI:
        """A ChatOpenAI on the episode (any ChatOpenAI argument may be given). `model` defaults to the
        one the gateway serves, asked for at the first request (no I/O here: building the graph inside
        a running event loop must not block it)."""
        headers = {**self.episode.headers, **(kwargs.pop("default_headers", None) or {})}
        return GroveChatOpenAI(
            model=model or SERVED_MODEL,
            grove_served_model=model is None,
            base_url=self.episode.base_url,
            api_key=self.episode.api_key,
            include_response_headers=True,  # x-grove-call-id: the spawner of the next workers
            use_responses_api=False,  # the gateway speaks chat completions
            grove=self,
            default_headers=headers or None,  # x-grove-launch of a runner-launched harness
            **kwargs,
        )

    def served_model(self) -> str:
        """The gateway's model name (GET /models once)."""
        if self._model_name is None:
            import httpx

            r = httpx.get(f"{self.episode.base_url}/models", timeout=60, headers=self._auth())
            r.raise_for_status()
            self._model_name = r.json()["data"][0]["id"]
        return self._model_name

    async def aserved_model(self) -> str:
        if self._model_name is None:
            import httpx

            async with httpx.AsyncClient(timeout=60) as client:
                r = await client.get(f"{self.episode.base_url}/models", headers=self._auth())
            r.raise_for_status()
            self._model_name = r.json()["data"][0]["id"]
        return self._model_name

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.episode.api_key}"}

    def config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`config` with grove's callback handler added (it sees which tasks `Send` started)."""
        out = dict(config or {})
        callbacks = out.get("callbacks") or []
        if not isinstance(callbacks, list):  # a callback manager: add to its inheritable handlers
            callbacks.add_handler(self.tracker, inherit=True)
        elif self.tracker not in callbacks:
            out["callbacks"] = [*callbacks, self.tracker]
        return out

    def invoke(self, graph: Any, inputs: Any, config: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        return graph.invoke(inputs, self.config(config), **kw)

    async def ainvoke(
        self, graph: Any, inputs: Any, config: Mapping[str, Any] | None = None, **kw: Any
    ) -> Any:
        return await graph.ainvoke(inputs, self.config(config), **kw)

    def close(self, final_answer: str = "", **kw: Any) -> dict:
        return self.episode.close(final_answer, **kw)

    async def aclose(self, final_answer: str = "", **kw: Any) -> dict:
        return await self.episode.aclose(final_answer, **kw)

    # ------------------------------------------------------------------------------- identity

    def mark_pushed(self, outer_ns: str, node: str) -> None:
        """A task reached by `Send` started (or made its first model call): it is the node's next worker."""
        with self._lock:
            if outer_ns not in self._pushed:
                self._workers[node] += 1
                self._pushed[outer_ns] = header_safe(f"{node}-{self._workers[node]}")

    def task_identity(self, metadata: Mapping[str, Any]) -> tuple[str, str | None]:
        """(agent, spawned_by) of a model run with this LangChain run metadata."""
        ns = metadata.get("langgraph_checkpoint_ns")
        if not ns:
            return self.root_agent, None  # not inside a graph: the root agent
        outer = str(ns).split("|")[0]
        path = metadata.get("langgraph_path") or ()
        if "|" not in str(ns) and path and path[0] == _PUSH:  # the call is in the Send task itself
            self.mark_pushed(outer, str(metadata.get("langgraph_node") or outer.split(":")[0]))
        with self._lock:
            if outer in self._tasks:
                return self._tasks[outer]
            worker = self._pushed.get(outer)
            if worker is None:
                identity: tuple[str, str | None] = (self.root_agent, None)
            else:
                identity = (worker, self.episode.last_call(self.root_agent))
            self._tasks[outer] = identity
            return identity

    def headers_for(
        self, agent: str, spawned_by: str | None, messages: Sequence[BaseMessage], metadata: Mapping[str, Any]
    ) -> dict[str, str]:
        kind = call_kind(metadata)
        if kind is not None:  # an auxiliary call of the agent: its own context, no spawn link
            return {AGENT_HEADER: agent, KIND_HEADER: kind}
        headers = {AGENT_HEADER: agent}
        if spawned_by and self.episode.last_call(agent) is None:
            # Only until the worker's first call is answered: after it, its requests continue (or
            # rewrite) its own context, and a spawner would say "a new invocation" to the gateway.
            headers[SPAWNED_BY_HEADER] = spawned_by
        summary = summary_text(messages)
        if summary is not None:
            with self._lock:
                if self._declared.get(agent) != summary:
                    headers[REWRITE_HEADER] = "1"
        return headers

    def after(
        self,
        agent: str,
        headers_sent: Mapping[str, str],
        messages: Sequence[BaseMessage],
        response_headers: Mapping[str, str] | None,
    ) -> None:
        """A response arrived: remember its call id; a declared rewrite is now the agent's history."""
        if response_headers:
            self.episode.record(response_headers)
        if headers_sent.get(REWRITE_HEADER):
            with self._lock:
                self._declared[agent] = summary_text(messages) or ""


def call_kind(metadata: Mapping[str, Any]) -> str | None:
    """The auxiliary kind of a model run: `summary` for SummarizationMiddleware's call, else the kind its
    metadata names (`grove_call_kind`); None for the agent's own action."""
    if metadata.get("lc_source") == SUMMARY_SOURCE:
        return SUMMARY
    kind = metadata.get(KIND_METADATA)
    if kind is None:
        return None
    if kind not in AUXILIARY_KINDS:
        raise UnknownCallKindError(
            f"model run metadata {KIND_METADATA}={kind!r} is not an auxiliary call kind; expected one of "
            f"{list(AUXILIARY_KINDS)} (or no {KIND_METADATA} for the agent's own action)"
        )
    return str(kind)


def summary_text(messages: Sequence[BaseMessage]) -> str | None:
    """The SummarizationMiddleware summary a history starts with (after system messages), else None."""
    for m in messages:
        if isinstance(m, SystemMessage):
            continue
        if isinstance(m, HumanMessage) and m.additional_kwargs.get("lc_source") == SUMMARY_SOURCE:
            return m.text if isinstance(m.text, str) else str(m.content)
        return None
    return None


class _TaskTracker(BaseCallbackHandler):
    """Notes the outer LangGraph tasks started by `Send` (their metadata is not visible to model calls
    nested in a subgraph or in an agent invoked inside the node)."""

    run_inline = True  # before the task's own runs start, on the graph's thread/loop

    def __init__(self, graphs: GroveGraphs) -> None:
        self.graphs = graphs

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, metadata: dict | None = None, **kw: Any
    ) -> None:
        md = metadata or {}
        ns, path = md.get("langgraph_checkpoint_ns"), md.get("langgraph_path") or ()
        if ns and "|" not in str(ns) and path and path[0] == _PUSH:
            self.graphs.mark_pushed(str(ns), str(md.get("langgraph_node")))


class GroveChatOpenAI(ChatOpenAI):
    """ChatOpenAI whose requests carry grove's identity headers (see the module docstring)."""

    grove: Any = Field(default=None, exclude=True)
    grove_agent: str | None = Field(default=None, exclude=True)
    grove_spawned_by: str | None = Field(default=None, exclude=True)
    grove_served_model: bool = Field(default=False, exclude=True)  # send the gateway's model name

    def for_agent(self, agent: str, *, spawned_by: str | None = None) -> GroveChatOpenAI:
        """This model as an explicitly named agent (header-safe version of `agent`)."""
        return self.model_copy(update={"grove_agent": header_safe(agent), "grove_spawned_by": spawned_by})

    def _identity(self, messages: Sequence[BaseMessage], run_manager: Any) -> tuple[str, dict[str, str]]:
        metadata = dict(getattr(run_manager, "metadata", None) or {})
        if self.grove_agent:
            agent, spawned_by = self.grove_agent, self.grove_spawned_by
        else:
            agent, spawned_by = self.grove.task_identity(metadata)
        return agent, self.grove.headers_for(agent, spawned_by, messages, metadata)

    @staticmethod
    def _with_headers(kwargs: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        return {**kwargs, "extra_headers": {**(kwargs.get("extra_headers") or {}), **headers}}

    @staticmethod
    def _response_headers(result: ChatResult) -> Mapping[str, str] | None:
        for gen in result.generations:  # LangChain merges generation_info into the message later
            headers = (gen.generation_info or {}).get("headers") or gen.message.response_metadata.get(
                "headers"
            )
            if headers:
                return headers
        return None

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        agent, headers = self._identity(messages, run_manager)
        if self.grove_served_model:
            kwargs = {**kwargs, "model": self.grove.served_model()}
        result = super()._generate(messages, stop, run_manager, **self._with_headers(kwargs, headers))
        self.grove.after(agent, headers, messages, self._response_headers(result))
        return result

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        agent, headers = self._identity(messages, run_manager)
        if self.grove_served_model:
            kwargs = {**kwargs, "model": await self.grove.aserved_model()}
        result = await super()._agenerate(messages, stop, run_manager, **self._with_headers(kwargs, headers))
        self.grove.after(agent, headers, messages, self._response_headers(result))
        return result

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        agent, headers = self._identity(messages, run_manager)
        if self.grove_served_model:
            kwargs = {**kwargs, "model": self.grove.served_model()}
        seen = None
        for chunk in super()._stream(messages, stop, run_manager, **self._with_headers(kwargs, headers)):
            seen = seen or _chunk_headers(chunk)
            yield chunk
        self.grove.after(agent, headers, messages, seen)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        agent, headers = self._identity(messages, run_manager)
        if self.grove_served_model:
            kwargs = {**kwargs, "model": await self.grove.aserved_model()}
        seen = None
        async for chunk in super()._astream(
            messages, stop, run_manager, **self._with_headers(kwargs, headers)
        ):
            seen = seen or _chunk_headers(chunk)
            yield chunk
        self.grove.after(agent, headers, messages, seen)


def _chunk_headers(chunk: ChatGenerationChunk) -> Mapping[str, str] | None:
    info = chunk.generation_info or {}
    return info.get("headers") or chunk.message.response_metadata.get("headers")
