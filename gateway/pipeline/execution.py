"""Running a planned request (gateway/pipeline/planning.py), `Execution`: act on its plan (`prepare`),
admit the call and record what the harness gets (`admit`).

    fit       -> the call's prompt ids built as the generate activity will build them: a prompt that
                 does not fit the served model's context is a 400 context_length_exceeded
                 (gateway/intake/context_window.py), before anything is opened, discarded or admitted
    act       -> open_context (new agent, or a rewrite), discard (retry), call -> CallResult (a large
                 completion by reference: read from the store and verified, capture/claims.py)
    record    -> written before the response leaves (capture/records.py), and indexed by its prompt for
                 a relaunch (gateway/pipeline/launch_records.py)
    delivery  -> a `Delivery` (gateway/pipeline/delivery.py) the route commits and settles

Call ids are deterministic per context: `{context_id}.c{n}`, n = the context's number of calls so far.
A chat continuation names its parent's staged arrays, and the generate activity splices the parent's
exact tokens in front of the new messages (grove.contracts.ChatPrompt).
"""

from __future__ import annotations

import asyncio

from capture.claims import completion_of, stash_prompt
from capture.records import ChatRecord, Usage, save_record
from gateway.intake.capture_request import CaptureRequest
from gateway.pipeline.capture_errors import ContextConflictError, MissingRecordError
from gateway.pipeline.capture_state import CaptureState
from gateway.pipeline.continuation import Decision, Move
from gateway.pipeline.delivery import Delivery
from gateway.pipeline.launch_records import index_call, prompt_digest
from gateway.pipeline.planning import Plan
from gateway.pipeline.routing import Target
from grove.contracts import CallRequest, CallResult, ChatPrompt, Completion, PromptSpec
from grove.receipts import ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from grove.store_layout import staging_key


class Execution:
    """Acts on plans through the capture's shared `state`: opens, discards, admits and records calls
    (module docstring)."""

    def __init__(self, state: CaptureState) -> None:
        self.state = state

    async def prepare(
        self,
        episode_id: str,
        request: CaptureRequest,
        plan: Plan,
        sampling: SamplingConfig | None,
        effective: SamplingConfig,
    ) -> CallRequest:
        """Open / discard as the plan says and build the call (its prompt stashed, its id registered as
        delivering); `sampling` is the request's (None: the episode's), `effective` what it samples with."""
        target, decision = plan.target, plan.decision
        base = await self._base(episode_id, decision)
        # Measured before anything is opened, discarded or admitted: a prompt that cannot fit is a 400.
        await self._check_fits(episode_id, target.context_id, request, base, effective)
        context_id, calls = target.context_id, _calls(target)
        if decision.move == Move.ROOT and target.opening is not None:
            await self._open(episode_id, target.opening)
        elif decision.move == Move.RETRY:
            await self.state.episodes.discard(
                episode_id, decision.acted_on().call_id, "the harness sent the same request again"
            )
        elif decision.move == Move.SKIP_EMPTY:
            await self.state.episodes.discard(
                episode_id, decision.acted_on().call_id,
                "empty response left out of the harness's next request (EOS-only reply): never trained",
            )  # fmt: skip
        elif decision.move == Move.REWRITE:
            rewrite = ContextRecord(
                context_id=target.rewrite_id,
                agent=target.agent,
                origin=ContextOrigin.REWRITE,
                rewrite_of=target.context_id,
            )
            await self._open(episode_id, rewrite)
            context_id, calls = rewrite.context_id, 0
        call = _call_request(episode_id, f"{context_id}.c{calls}", context_id, request, plan, base, sampling)
        # Claim check: the messages go to the store, the Update carries their key and digest.
        call = await asyncio.to_thread(stash_prompt, self.state.store, episode_id, call)
        # Delivering from here on: a request of this context that arrives after the ledger completed the
        # call and before its response left must wait, not decide on it.
        self.state.start_delivering(episode_id, call.call_id)
        return call

    async def admit(
        self,
        episode_id: str,
        request: CaptureRequest,
        plan: Plan,
        call: CallRequest,
        launch: int | None,
    ) -> Delivery:
        """The call Update (admission, generation), then the chat record, written before any response."""
        try:
            result = await self.state.episodes.call(episode_id, call)
            # A large completion came by reference (capture/claims.py): read and verified here.
            completion = await asyncio.to_thread(completion_of, self.state.store, episode_id, result)
            record = _record_of(episode_id, call, result, completion, request, plan, launch)
            await asyncio.to_thread(save_record, self.state.store, record)
            digest = await asyncio.to_thread(prompt_digest, request.messages, request.tools)
            await asyncio.to_thread(index_call, self.state.store, episode_id, digest, record.call_id)
        except BaseException:
            self.state.release(episode_id, call.call_id)
            raise
        return Delivery(self.state, record, call.call_id)

    async def _base(self, episode_id: str, decision: Decision) -> ChatRecord | None:
        """The call this request's call will extend (None: a root)."""
        if decision.move == Move.CONTINUE:
            return decision.head
        if decision.move not in (Move.RETRY, Move.SKIP_EMPTY):
            return None
        head = decision.acted_on()
        if head.extends is None:
            return None
        return await self._parent(episode_id, head, head.extends)  # extends what the head extended

    async def _check_fits(
        self,
        episode_id: str,
        context_id: str,
        request: CaptureRequest,
        base: ChatRecord | None,
        sampling: SamplingConfig,
    ) -> None:
        prompt = _prompt_spec(episode_id, request, base)
        if self.state.tokens is not None:
            await self.state.tokens.check(f"{episode_id}/{context_id}", episode_id, prompt, sampling)
        elif self.state.window is not None:
            await asyncio.to_thread(self.state.window.check, episode_id, prompt, sampling)

    async def _open(self, episode_id: str, record: ContextRecord) -> None:
        opened = await self.state.episodes.open_context(episode_id, record)
        if opened != record:  # a concurrent request opened this id with another reservation
            raise ContextConflictError(
                f"episode {episode_id!r}: context {record.context_id!r} was opened concurrently as {opened}, "
                f"not {record}; retry the request"
            )

    async def _parent(self, episode_id: str, head: ChatRecord, extends: str) -> ChatRecord:
        parent = await self.state.record(episode_id, extends)
        if parent is None:
            raise MissingRecordError(
                f"episode {episode_id!r}: call {head.call_id!r} is retried, but the chat record of the "
                f"call it extends ({extends!r}) is missing; the retry cannot be spliced onto it"
            )
        return parent


def _calls(target: Target) -> int:
    return 0 if target.current is None else sum(target.current.counts.values())


def _prompt_spec(episode_id: str, request: CaptureRequest, base: ChatRecord | None) -> PromptSpec:
    chat = ChatPrompt(
        messages=request.messages,
        tools=request.tools,
        parent_messages=base.messages if base else None,
        parent_response=base.response if base else None,  # what the harness got: nothing re-parsed
    )
    return PromptSpec(
        chat=chat,
        parent_call_id=base.call_id if base else None,
        parent_staging_key=staging_key(episode_id, base.call_id) if base else None,
    )


def _call_request(
    episode_id: str,
    call_id: str,
    context_id: str,
    request: CaptureRequest,
    plan: Plan,
    base: ChatRecord | None,
    sampling: SamplingConfig | None,
) -> CallRequest:
    prompt = _prompt_spec(episode_id, request, base)
    return CallRequest(
        call_id=call_id,
        context_id=context_id,
        kind=plan.identity.kind,
        extends=base.call_id if base else None,
        prompt=prompt,
        sampling=sampling,
        completion_by_ref=True,  # admit reads it with completion_of
        # trained only once the route records its delivery (gateway/pipeline/delivery.py)
        await_delivery=True,
    )


def _record_of(
    episode_id: str,
    call: CallRequest,
    result: CallResult,
    completion: Completion,
    request: CaptureRequest,
    plan: Plan,
    launch: int | None,
) -> ChatRecord:
    return ChatRecord(
        episode_id=episode_id,
        call_id=result.call_id,  # a retry after a lost attempt completes under its own id
        context_id=call.context_id,
        agent=plan.target.agent,
        kind=call.kind,
        extends=call.extends,
        messages=request.messages,
        tools=request.tools,
        response=completion.assistant_message,
        finish_reason=result.finish_reason,
        usage=Usage(prompt_tokens=result.digests.prompt_len, completion_tokens=result.digests.completion_len),
        policy_version=result.policy_version,
        session_id=plan.identity.session_id,
        launch=launch,
    )
