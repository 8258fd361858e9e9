"""The OpenAI Agents SDK on grove: a ModelProvider bound to an episode that names agents by itself.

    provider = GroveModelProvider(Episode.from_env())
    result = await Runner.run(lead, task, run_config=provider.run_config())
    await provider.episode.aclose(final_answer=str(result.final_output))

- Chat completions, always: the SDK's default Responses API is not what the gateway serves.
- agent: every agent id reads as the SDK agent's name (`ReadableAgents`: "Triage agent" ->
  `Triage-agent`): the run's starting agent is the root agent under its own name (pass `root_agent=` to
  `run_config()` for a fixed one, e.g. `parent` where a reward reads that name); a handoff target is its
  own name; an agent run as a tool (`agent.as_tool`) is `{agent.name}-{tool call id}`, one agent per
  invocation, so two concurrent calls of the same worker tool never share a context.
- handoffs: the agent a handoff transfers to is spawned by the call that handed off: the handoff is a
  tool call in that call's response, stamped with its grove call id, and the receiving agent's first
  request carries that item in its input (agents_handoffs.py reads it), in a plain, a streamed and a
  Temporal-native run alike; nothing to declare. An agent handed back to, the root included, enters
  again: a new context of that agent spawned by the call that handed back (the history it gets holds
  the other agent's turns, so it extends none of its own contexts).
- spawn link: a worker's requests name the call whose response held its tool call. This provider's
  model stamps each response's items with the grove call id (`x-grove-call-id`); the SDK hands that
  item to the tool as `ToolContext.tool_call`, which is where the spawner is read from (by a wrapper
  the filter puts around each function tool: it passes the invocation to the nested run).
- spawn links of custom agent-tools: a `function_tool` that runs an agent itself (`Runner.run` inside
  the tool) gets the same: its runs are the agent `{agent.name}-{tool call id}`, spawned by that call,
  and several runs inside one invocation are one agent (its later runs continue or rewrite its context).
- compaction: pass your own filter, `provider.run_config(call_model_input_filter=f)` (a summariser,
  `agents.extensions.ToolOutputTrimmer`, ...); grove's filter runs it inside its own. Model calls made
  while it runs write the agent's new input: they are the summary of that agent's context
  (`x-grove-call-kind: summary`, in `<agent>~summary`; trained when the run trains summaries); a call
  whose input it changed so that it no longer extends what the agent sent last declares a rewrite
  (`x-grove-rewrite`).
- How the identity reaches the request: `run_config()` installs a `call_model_input_filter` (it sees
  the agent and the tool-call context of every model call). In a plain process it passes the headers
  to the model through a context variable; inside a Temporal workflow (temporalio.contrib.openai_agents)
  the model runs in an activity, so the filter puts them into the agent's model settings, which travel
  with the activity's input (`extra_args["grove_identity"]`, removed before the request is sent).

Temporal-native runs (the integration's runner replaces every agent's model with a stub that calls a
`ModelProvider` in an activity): give the worker `OpenAIAgentsPlugin(model_provider=
GroveModelProvider())` and run agents in the workflow with `run_config=grove_run_config(base_url,
api_key)`; the episode's URL and token travel in `extra_args["grove_episode"]`. An activity retry re-sends
the same request, which the gateway recognises as a retry (the earlier call is discarded, the new one
extends what the earlier one extended): nothing is trained twice.

Streamed runs (`Runner.run_streamed`, and `as_tool(on_stream=...)` nested runs): `stream_response` sends
the same request with `stream: true`; the gateway answers with server-sent chunks of the finished call
(tool calls included), and every stream event that names a response or an item is stamped with the call
id, so identity and spawn links are those of `Runner.run`. A stream the program drops before its end
(`result.cancel()`, a closed connection) leaves the call undelivered: the gateway discards it (never
trained); the program's next request is a fresh call. Inside a Temporal workflow a streamed run is refused
(AgentsConfigError): on that path the SDK resolves the model settings before the filter runs, so the
activity could not name its agent.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import json
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from agents import (
    FunctionTool,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
)
from agents.run_config import CallModelData, CallModelInputFilter, ModelInputData
from openai import AsyncOpenAI

from grove.headers import AGENT_HEADER, CALL_ID_HEADER, KIND_HEADER, REWRITE_HEADER, SPAWNED_BY_HEADER
from harnesses.clients import SUMMARY, Episode, ReadableAgents, header_safe
from harnesses.clients.agents_handoffs import FAKE_ID, handoff_spawner, handoff_targets

EPISODE_ARG = "grove_episode"  # model_settings.extra_args: {"base_url", "api_key"} (Temporal runs)
IDENTITY_ARG = "grove_identity"  # model_settings.extra_args: identity headers (Temporal runs)
MAX_AGENT_CHARS = (
    96  # a longer agent id would be hashed by the gateway (gateway.pipeline.identity.canonical_agent)
)
_IDENTITY: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "grove_identity", default=None
)
_TOOL_CALL: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "grove_tool_call", default=None
)
# The invoke functions wrap_agent_tools installed: a tool whose on_invoke_tool is one of them is wrapped.
_WRAPPERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
_AUX_OF: contextvars.ContextVar[str | None] = contextvars.ContextVar("grove_aux_of", default=None)
_RESPONSE: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "grove_response", default=None
)


class AgentsConfigError(ValueError):
    """A grove model call without an episode to send it to."""


def _in_workflow() -> bool:
    try:
        from temporalio import workflow
    except ImportError:  # no Temporal installed: never inside a workflow
        return False
    return workflow.in_workflow()


class IdentityFilter:
    """`RunConfig.call_model_input_filter`: decides each model call's agent and spawner (see module
    docstring), and runs the program's own filter, if any (`input_filter`), inside it. One per
    top-level run: its first agent outside a tool call is the root agent.

    The filter sees the agent but not the tool call a nested run serves (the SDK hands it the
    application context only), so the first time it meets an agent it wraps that agent's function tools
    (`as_tool` agent-tools, and tools that run an agent themselves): the wrapper notes the invoking
    ToolContext's call ids in a context variable for the nested run, which executes inside it.

    The program's filter may rewrite the history (compaction: summarise older turns, trim old tool
    outputs). Model calls made while it runs (a summariser agent's, a direct model call) write what the
    agent will know: they are the summary of its context (`x-grove-call-kind: summary`: the gateway
    names them `<agent>~summary`; trained only when the run trains summaries).
    A call whose input the filter changed, or whose agent's previous input it had changed, and that
    does not extend what that agent sent last, declares a rewrite (`x-grove-rewrite: 1`); a filter that
    keeps producing the same rewritten prefix continues that rewritten context.

    `root_agent`: the root agent's id; None (the default) names it after the run's starting agent, as
    every other agent is named (`ReadableAgents`)."""

    def __init__(
        self, root_agent: str | None = None, input_filter: CallModelInputFilter | None = None
    ) -> None:
        self.root_agent = root_agent
        self.input_filter = input_filter
        self.agent_id = ReadableAgents()
        self._root_name: str | None = None
        self._sent: dict[str, tuple[str, ...]] = {}  # agent -> the input it sent last (item keys)
        self._filtered: dict[str, bool] = {}  # agent -> whether `input_filter` had changed that input
        self._handoffs: dict[str, str] = {}  # handoff tool name -> the agent it transfers to

    def identity(self, agent: Any, items: Any = ()) -> dict[str, str]:
        """The call's identity headers; `items`: its input, where a handoff names its spawner."""
        aux_of = _AUX_OF.get()
        if aux_of is not None:  # a call made by the program's filter, for the agent it filters
            return {AGENT_HEADER: aux_of, KIND_HEADER: SUMMARY}
        headers = self._agent_headers(agent)
        handed_off_by = handoff_spawner(items, agent.name, self._handoffs)
        if handed_off_by:  # the request that enters a handoff target: spawned by the handing-off call
            headers[SPAWNED_BY_HEADER] = handed_off_by
        return headers

    def _agent_headers(self, agent: Any) -> dict[str, str]:
        invocation = _TOOL_CALL.get()
        if invocation is not None:  # inside an agent-tool: a worker of its own, spawned by that call
            tool_call_id, spawner = invocation
            headers = {AGENT_HEADER: self._invocation_id(agent.name, tool_call_id)}
            if spawner:
                headers[SPAWNED_BY_HEADER] = spawner
            return headers
        if self._root_name is None:
            self._root_name = agent.name
        if agent.name == self._root_name and self.root_agent is not None:
            return {AGENT_HEADER: self.root_agent}
        return {AGENT_HEADER: self.agent_id(agent.name)}  # the root, or a handoff target

    def _invocation_id(self, name: str, tool_call_id: str) -> str:
        """`{agent id}-{tool call id}`; header_safe's form where that is longer than an agent id may be."""
        readable = f"{self.agent_id(name)}-{tool_call_id}"
        return readable if len(readable) <= MAX_AGENT_CHARS else header_safe(f"{name}-{tool_call_id}")

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        wrap_agent_tools(data.agent)
        self._handoffs.update(handoff_targets(data.agent))  # who may hand off to whom, seen so far
        model_data = data.model_data
        headers = self.identity(data.agent, model_data.input)
        if self.input_filter is not None and KIND_HEADER not in headers:
            before = input_keys(model_data)
            model_data = await self._run_input_filter(data, headers[AGENT_HEADER])
            self._note_input(headers, before, input_keys(model_data))
        if _in_workflow():
            # The model runs in an activity: the identity must travel in its input. `data.agent` is the
            # integration's per-run copy of the agent, so this changes no agent another run uses.
            ms = data.agent.model_settings
            data.agent.model_settings = dataclasses.replace(
                ms, extra_args={**(ms.extra_args or {}), IDENTITY_ARG: headers}
            )
        else:
            _IDENTITY.set(headers)  # read by GroveModel in this task (the filter runs just before it)
        return model_data

    async def _run_input_filter(self, data: CallModelData[Any], agent: str) -> ModelInputData:
        """The program's filter, with every model call it makes marked as the summary of `agent`'s context."""
        assert self.input_filter is not None
        aux = {AGENT_HEADER: agent, KIND_HEADER: SUMMARY}
        aux_token, identity_token = _AUX_OF.set(agent), _IDENTITY.set(aux)
        try:
            result = self.input_filter(data)
            return await result if inspect.isawaitable(result) else result
        finally:
            _IDENTITY.reset(identity_token)
            _AUX_OF.reset(aux_token)

    def _note_input(self, headers: dict[str, str], before: tuple[str, ...], sent: tuple[str, ...]) -> None:
        """Declare a rewrite where the program's filter made this input other than an extension of what
        the agent sent last (the gateway checks every undeclared request for an exact extension)."""
        agent = headers[AGENT_HEADER]
        changed = sent != before
        previous = self._sent.get(agent)
        if (changed or self._filtered.get(agent, False)) and (
            previous is None or sent[: len(previous)] != previous
        ):
            headers[REWRITE_HEADER] = "1"  # with no context yet the gateway opens a root: harmless
        self._sent[agent], self._filtered[agent] = sent, changed


def input_keys(data: ModelInputData) -> tuple[str, ...]:
    """A comparable form of a model input: its instructions, then each input item as canonical JSON."""
    items = data.input if isinstance(data.input, list) else [data.input]
    return (json.dumps(data.instructions), *(_item_key(item) for item in items))


def _item_key(item: Any) -> str:
    if hasattr(item, "model_dump"):
        item = item.model_dump(mode="json", exclude_none=True)
    return json.dumps(item, sort_keys=True, default=str)


def wrap_agent_tools(agent: Any) -> None:
    """Make each function tool of `agent` publish its invocation (tool call id, spawning call) to any
    agent run inside it: an `as_tool` agent-tool's nested run, or the runs of a tool that runs agents
    itself (`Runner.run` in a `function_tool`, the SDK's pattern for custom agent-tools). Idempotent; a
    tool that runs no agent is unaffected."""
    for tool in getattr(agent, "tools", ()):
        if not isinstance(tool, FunctionTool) or tool.on_invoke_tool in _WRAPPERS:
            continue
        original = tool.on_invoke_tool

        async def invoke(ctx: Any, arguments: str, _original: Any = original) -> Any:
            spawner = getattr(getattr(ctx, "tool_call", None), "id", None)
            invocation = (ctx.tool_call_id, None if spawner in (None, FAKE_ID) else spawner)
            token = _TOOL_CALL.set(invocation)
            try:
                return await _original(ctx, arguments)
            finally:
                _TOOL_CALL.reset(token)

        tool.on_invoke_tool = invoke
        _WRAPPERS.add(invoke)


def grove_run_config(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    root_agent: str | None = None,
    provider: ModelProvider | None = None,
    call_model_input_filter: CallModelInputFilter | None = None,
    **kwargs: Any,
) -> RunConfig:
    """A RunConfig for grove: the identity filter (around the program's own `call_model_input_filter`,
    if given; `root_agent`: a fixed id for the root agent, else its own name), tracing off (nothing to
    export to), and, when given, the episode's URL and token in the model settings (how a Temporal
    workflow names its episode)."""
    settings = ModelSettings()
    if base_url is not None:
        settings = ModelSettings(extra_args={EPISODE_ARG: {"base_url": base_url, "api_key": api_key or ""}})
    options: dict[str, Any] = {"tracing_disabled": True, **kwargs}
    if provider is not None:
        options["model_provider"] = provider
    identity = IdentityFilter(root_agent, call_model_input_filter)
    return RunConfig(model_settings=settings, call_model_input_filter=identity, **options)


class GroveModelProvider(ModelProvider):
    """Models that send chat completions to a grove episode with identity headers. Without an episode
    (a Temporal worker serving many episodes), each call names its episode in its model settings."""

    def __init__(self, episode: Episode | None = None, *, model_name: str | None = None) -> None:
        self.episode = episode
        self.model_name = model_name  # None: the model the gateway serves
        self._clients: dict[tuple[str, str], AsyncOpenAI] = {}
        self._episodes: dict[tuple[str, str], Episode] = {}
        self._served: dict[str, str] = {}

    def bound(self, base_url: str, api_key: str) -> Episode:
        """The episode a call names in its model settings (Temporal-native runs), one per URL and token,
        so what its responses said (each agent's last call) stays readable: `provider.bound(url, key)`."""
        key = (base_url.rstrip("/"), api_key)
        if key not in self._episodes:
            self._episodes[key] = Episode(base_url, api_key)
        return self._episodes[key]

    def get_model(self, model_name: str | None) -> Model:
        return GroveModel(self, model_name or self.model_name)

    def run_config(self, **kwargs: Any) -> RunConfig:
        return grove_run_config(provider=self, **kwargs)

    def client(self, episode: Episode) -> AsyncOpenAI:
        key = (episode.base_url, episode.api_key)
        if key not in self._clients:
            http = httpx.AsyncClient(timeout=600, event_hooks={"response": [_note_response]})
            # Retries belong to the caller (the SDK's, or Temporal's activity retries); the gateway
            # recognises a re-sent request either way.
            self._clients[key] = AsyncOpenAI(
                base_url=episode.base_url,
                api_key=episode.api_key,
                # openai types http_client as httpx2's client; it accepts an httpx one at runtime too
                http_client=http,  # type: ignore[arg-type]
                max_retries=0,
                default_headers=episode.headers or None,  # x-grove-launch of a runner-launched harness
            )
        return self._clients[key]

    async def served_model(self, episode: Episode) -> str:
        if episode.base_url not in self._served:
            models = await self.client(episode).models.list()
            self._served[episode.base_url] = models.data[0].id
        return self._served[episode.base_url]


async def _note_response(response: httpx.Response) -> None:
    holder = _RESPONSE.get()
    if holder is not None and CALL_ID_HEADER in response.headers:
        holder[CALL_ID_HEADER] = response.headers[CALL_ID_HEADER]
        holder[AGENT_HEADER] = response.headers.get(AGENT_HEADER, "")


class GroveModel(Model):
    """One chat-completions call per `get_response`, on the episode of the provider or of the call's
    model settings, with the identity the filter chose; the response's items carry the grove call id."""

    def __init__(self, provider: GroveModelProvider, model_name: str | None) -> None:
        self.provider = provider
        self.model_name = model_name

    def _split(self, settings: ModelSettings) -> tuple[Episode, dict[str, str], ModelSettings]:
        extra = dict(settings.extra_args or {})
        ep_args, identity = extra.pop(EPISODE_ARG, None), extra.pop(IDENTITY_ARG, None)
        episode = self.provider.episode
        if episode is None:
            if not ep_args:
                raise AgentsConfigError(
                    "GroveModelProvider has no episode and the call names none; pass "
                    "GroveModelProvider(Episode(...)) or run with grove_run_config(base_url, api_key)"
                )
            episode = self.provider.bound(ep_args["base_url"], ep_args["api_key"])
        headers = {**(identity or {}), **(_IDENTITY.get() or {})}
        settings = dataclasses.replace(
            settings,
            # The SDK's implicit settings for its default (gpt-5) model ask for reasoning effort and
            # verbosity; the served policy has neither and the gateway refuses unknown parameters.
            reasoning=None,
            verbosity=None,
            extra_args=extra or None,
            extra_headers={**(settings.extra_headers or {}), **headers},
        )
        return episode, headers, settings

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        *,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
        **kwargs: Any,
    ) -> ModelResponse:
        episode, _, settings = self._split(model_settings)
        model = await self._chat_model(episode)
        holder: dict[str, str] = {}
        token = _RESPONSE.set(holder)
        try:
            response = await model.get_response(
                system_instructions,
                input,
                settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=None,
                conversation_id=None,
                prompt=prompt,
            )
        finally:
            _RESPONSE.reset(token)
        call_id = _record_call(episode, holder)
        if call_id:
            _stamp(response, call_id)
        return response

    async def _chat_model(self, episode) -> OpenAIChatCompletionsModel:
        """The SDK's chat-completions model on this episode's gateway client (both paths call it)."""
        name = self.model_name or await self.provider.served_model(episode)
        return OpenAIChatCompletionsModel(model=name, openai_client=self.provider.client(episode))

    async def stream_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        """`Runner.run_streamed`'s model call: the same request as `get_response` with `stream: true`
        (the gateway answers with server-sent chunks of the finished call). Every event that names a
        response or an output item is stamped with the grove call id, as `get_response` stamps its
        items, so a tool call in the stream hands its worker the spawning call just the same."""
        extra = model_settings.extra_args or {}
        if EPISODE_ARG in extra and IDENTITY_ARG not in extra and _IDENTITY.get() is None:
            raise AgentsConfigError(
                "a streamed run (Runner.run_streamed) inside a Temporal workflow: the SDK resolves "
                "each turn's model settings before grove's identity filter runs on that path, so the "
                "call could not name its agent; use Runner.run in workflows (streaming works in a "
                "plain process with GroveModelProvider(episode).run_config())"
            )
        episode, _, settings = self._split(model_settings)
        if settings.include_usage is None:  # the SDK asks for usage only from api.openai.com by default
            settings = dataclasses.replace(settings, include_usage=True)  # the call's real token counts
        model = await self._chat_model(episode)
        holder: dict[str, str] = {}
        # Set in the task that iterates this stream (the SDK may iterate it in a task of its own): the
        # client's response hook fills it when the response headers arrive, before the first event.
        token = _RESPONSE.set(holder)
        recorded = False
        try:
            async for event in model.stream_response(
                system_instructions,
                input,
                settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=None,
                conversation_id=None,
                prompt=prompt,
            ):
                call_id = holder.get(CALL_ID_HEADER)
                if call_id:
                    if not recorded:
                        recorded = _record_call(episode, holder) is not None
                    _stamp_event(event, call_id)
                yield event
        finally:
            # closed from another context (garbage collection): nothing to undo there
            with contextlib.suppress(ValueError):
                _RESPONSE.reset(token)


def _record_call(episode, holder: dict[str, str]) -> str | None:
    """Record the grove call the response headers named (the next call's spawner); its id, or None."""
    call_id = holder.get(CALL_ID_HEADER)
    if call_id:
        episode.record({CALL_ID_HEADER: call_id, AGENT_HEADER: holder.get(AGENT_HEADER, "")})
    return call_id


def _stamp(response: ModelResponse, call_id: str) -> None:
    """Each output item's id := the grove call id (chat completions has none of its own: the SDK puts a
    placeholder there), so a tool call handed to a worker names the call that made it."""
    response.response_id = call_id
    _stamp_items(response.output, call_id)


def _stamp_items(items: Any, call_id: str) -> None:
    for item in items or ():
        if getattr(item, "id", None) in (None, FAKE_ID):
            try:
                item.id = call_id
            except (AttributeError, TypeError, ValueError):  # an item type without an id field
                continue


def _stamp_event(event: Any, call_id: str) -> None:
    """A stream event's placeholder ids := the grove call id: the response of `response.created` /
    `response.completed` (its id becomes ModelResponse.response_id, its output the turn's items), the
    item of `response.output_item.added/done`, and the `item_id` of the delta events."""
    response = getattr(event, "response", None)
    if response is not None:
        if getattr(response, "id", None) in (None, FAKE_ID):
            response.id = call_id
        _stamp_items(getattr(response, "output", None), call_id)
    item = getattr(event, "item", None)
    if item is not None:
        _stamp_items([item], call_id)
    if getattr(event, "item_id", None) == FAKE_ID:
        event.item_id = call_id
