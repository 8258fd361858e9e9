"""The native harness: agent programs whose model calls go through the episode's capture path.

A program runs *inside* EpisodeWorkflow (deterministic workflow code, no I/O), so a crashed worker
replays it instead of losing it. It talks to the episode through `EpisodeHost` (the workflow:
`open_context` and `call`), and reads like an agent program:

    parent = await episode.root("parent", [system, user])
    plan = await parent.reply()
    w1, w2 = await episode.spawn("worker-1", by=parent, messages=...), ...
    answers = await asyncio.gather(w1.reply(), w2.reply())        # concurrent contexts
    final = await parent.reply(*[tool_result(a.text) for a in answers])
    summary = await w1.compact("Summarize your work so far.")     # summary call, then a declared rewrite

`compact`'s summary call is a call of kind SUMMARY in the agent's own context (the summary of that
context: trained when the run trains summaries, RunConfig.train_auxiliary); `reply(kind=CallKind.TITLE)`
makes a title call, never trained.

Each agent keeps its conversation as chat messages; the generate activity renders them with the
model's chat template and splices the parent call's exact tokens in front of the new messages, so a
continuation is a token-exact extension by construction. Call and context ids are deterministic:
`{agent}.{segment}` for contexts, `{context}.c{n}` for calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from temporalio.exceptions import ApplicationError

from grove.contracts import (
    CallRequest,
    CallResult,
    ChatDelta,
    ChatPrompt,
    EpisodeSpec,
    HarnessOutcome,
    PromptSpec,
)
from grove.episodes import FailureKind
from grove.receipts import AUX_SEPARATOR, CallKind, ContextOrigin, ContextRecord

Message = dict[str, Any]


class NativeHarnessError(RuntimeError):
    """A native program broke a harness rule (reply before spawn, unknown program, ...)."""


class InlineCallResult(CallResult):
    """A native call's result: the host (`EpisodeHost.call`) always returns its completion inline."""

    text: str
    assistant_message: dict[str, Any]


# The ApplicationError type of a call whose generation failed, and the detail that says who failed it
# (workflows/episode.py raises it; the first detail is the FailureKind).
GENERATION_FAILED = "GenerationFailed"


def failure_kind(err: BaseException) -> FailureKind:
    """Who is to blame when a native program raised (the failure rule of grove/episodes.py).

    The program's own errors (a harness rule broken: reply before spawn, a malformed tool call, a
    ledger rule broken by the program's calls) are the policy's. A failed generation carries its
    kind, decided where the failure was seen (workflows/episode.py): a prompt too long or otherwise
    refused for the policy's request is the policy's; lost attempts exhausted or a broken engine
    are the infrastructure's.
    """
    if isinstance(err, ApplicationError) and err.type == GENERATION_FAILED:
        return "infrastructure" if "infrastructure" in err.details else "policy"
    return "policy"


def failure_outcome(err: BaseException) -> HarnessOutcome:
    """The outcome of a native program that raised: failed, with its reason and kind."""
    return HarnessOutcome(failure=f"{type(err).__name__}: {err}", failure_kind=failure_kind(err))


class EpisodeHost(Protocol):
    @property
    def spec(self) -> EpisodeSpec: ...  # read-only: a host may hold a subclass (the workflow's EpisodeRun)

    async def open_context(self, record: ContextRecord) -> ContextRecord: ...

    async def call(self, req: CallRequest) -> CallResult: ...


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def system(text: str) -> Message:
    return {"role": "system", "content": text}


def tool_result(text: str, name: str = "worker") -> Message:
    return {"role": "tool", "name": name, "content": text}


@dataclass
class Agent:
    """One agent's current context as a conversation; `reply` is one model call in it."""

    host: EpisodeHost
    name: str
    context_id: str
    base: list[Message]  # the messages the context starts with
    tools: list[dict[str, Any]] | None = None
    segment: int = 0
    history: list[Message] = field(default_factory=list)  # prompt messages of the last call + its reply
    last: CallResult | None = None
    last_prompt: list[Message] | None = None
    calls: int = 0
    outputs: list[str] = field(default_factory=list)  # texts of this agent's replies (all segments)
    summaries: list[str] = field(default_factory=list)  # texts of its summary calls (`compact`)

    async def reply(self, *observations: Message, kind: CallKind = CallKind.ACTION) -> InlineCallResult:
        """Add observations (user turns, tool results) and let the policy answer."""
        messages = (self.history if self.last else list(self.base)) + list(observations)
        if self.last is not None and self.last.conversation_ref is not None:
            # The parent's conversation is in the store (its generate activity wrote it): only the new
            # messages cross Temporal, so a long conversation does not ride in every call's input again.
            delta = ChatDelta(parent_conversation=self.last.conversation_ref, messages=list(observations))
            prompt = PromptSpec(
                chat_delta=delta, parent_call_id=self.last.call_id, parent_staging_key=self.last.staging_key
            )
        else:  # a root, or a parent result naming no conversation (an older inference worker, a replay)
            prompt = PromptSpec(
                chat=ChatPrompt(messages=messages, tools=self.tools, parent_messages=self.last_prompt),
                parent_call_id=self.last.call_id if self.last else None,
                parent_staging_key=self.last.staging_key if self.last else None,
            )
        call_id = f"{self.context_id}.c{self.calls}"
        self.calls += 1
        result = _inline(
            await self.host.call(
                CallRequest(
                    call_id=call_id,
                    context_id=self.context_id,
                    kind=kind,
                    extends=self.last.call_id if self.last else None,
                    prompt=prompt,
                )
            )
        )
        self.last, self.last_prompt = result, messages
        self.history = messages + [result.assistant_message]
        if kind == CallKind.ACTION:
            self.outputs.append(result.text)
        return result

    async def compact(
        self, instruction: str, *, keep: int | None = None, template: str = "Summary of your work so far: {}"
    ) -> InlineCallResult:
        """Summary call (kind SUMMARY) in this context, then a declared rewrite: the next segment starts
        from the first `keep` base messages (default: all of them) plus the summary as a user turn
        (`template` with the summary's text in place of `{}`)."""
        summary = await self.reply(user(instruction), kind=CallKind.SUMMARY)
        record = ContextRecord(
            context_id=f"{self.name}.{self.segment + 1}",
            agent=self.name,
            origin=ContextOrigin.REWRITE,
            rewrite_of=self.context_id,
        )
        await self.host.open_context(record)
        kept = self.base if keep is None else self.base[:keep]
        self.base = kept + [user(template.format(summary.text))]
        self.context_id, self.segment = record.context_id, self.segment + 1
        self.history, self.last, self.last_prompt, self.calls = [], None, None, 0
        self.summaries.append(summary.text)
        return summary


def _inline(result: CallResult) -> InlineCallResult:
    if result.text is None or result.assistant_message is None:
        raise NativeHarnessError(
            f"call {result.call_id!r} came back with its completion by reference "
            f"({result.completion_ref}); a native program's host must return it inline (EpisodeHost.call)"
        )
    return InlineCallResult.model_validate(result.model_dump())


Program = Callable[["NativeEpisode"], Awaitable[str]]


class NativeEpisode:
    """What a program gets: open the root agent, spawn workers from a call of another agent."""

    def __init__(self, host: EpisodeHost) -> None:
        self.host = host
        self.spec = host.spec
        self.agents: dict[str, Agent] = {}

    async def root(self, name: str, messages: list[Message], tools: list[dict] | None = None) -> Agent:
        record = ContextRecord(context_id=f"{name}.0", agent=name, origin=ContextOrigin.ROOT)
        return await self._open(record, messages, tools)

    async def spawn(
        self, name: str, *, by: Agent, messages: list[Message], tools: list[dict] | None = None
    ) -> Agent:
        """A worker context linked to `by`'s latest call (the response that delegated the work)."""
        if by.last is None:
            raise NativeHarnessError(
                f"agent {by.name!r} spawns {name!r} before any call of its context {by.context_id!r}; "
                "a worker must be spawned by a call (reply first)"
            )
        record = ContextRecord(
            context_id=f"{name}.0", agent=name, origin=ContextOrigin.SPAWN, spawned_by_call=by.last.call_id
        )
        return await self._open(record, messages, tools)

    async def _open(self, record: ContextRecord, messages: list[Message], tools: list[dict] | None) -> Agent:
        await self.host.open_context(record)
        agent = Agent(self.host, record.agent, record.context_id, list(messages), tools)
        self.agents[record.agent] = agent
        return agent

    def outputs(self) -> dict[str, list[str]]:
        """Each agent's replies, and its summaries under `<agent>~summary` (as external harnesses' summary
        calls are named) for an agent that compacted."""
        out = {name: list(agent.outputs) for name, agent in self.agents.items()}
        for name, agent in self.agents.items():
            if agent.summaries:
                out[f"{name}{AUX_SEPARATOR}summary"] = list(agent.summaries)
        return out


async def run_program(
    spec: EpisodeSpec, host: EpisodeHost, programs: Mapping[str, Program]
) -> HarnessOutcome:
    """Run the spec's native program (looked up in `programs`) to its final answer."""
    program = programs.get(spec.harness.program)
    if program is None:
        raise NativeHarnessError(
            f"unknown native program {spec.harness.program!r} for episode {spec.episode_id}; "
            f"known: {sorted(programs)}"
        )
    episode = NativeEpisode(host)
    final = await program(episode)
    return HarnessOutcome(final_answer=final, outputs=episode.outputs())
