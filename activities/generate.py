"""The `generate` activity: build a call's exact prompt, sample it in the worker's engine, stage its tokens.

Input and result are grove.contracts.GenerateInput / GenerateResult. Token arrays never travel in
Temporal payloads: a continuation names its parent's staged object and adds only the new suffix,
and the activity builds `prompt = parent prompt + parent completion + suffix` from the store, so the
continuation is exact by construction. A chat prompt is rendered with the model's chat template,
splicing the parent's exact tokens the same way (chat/render.py). The assembly is capture/prompt.py
`build_prompt`, the same function the gateway's context window measures prompts with.

Staging (idempotent, deterministic keys: grove/store_layout.py):
1. `staging_key(episode, call)`: the call's CallTokens (grove/staging_format.py), written last with
   put_if_absent: it is the commit of the call.
2. `staged_receipt_key(episode, call, sha)`: a small JSON with what the arrays do not hold (policy version,
   finish reason, the sampling processing the engine sampled with), keyed by the sha256 of the
   arrays' bytes and written *before* them.
The result carries that sampling processing (`GenerateResult.sampling`, from the staged receipt, so
a re-run reports what the staged tokens were really sampled with); the workflow records it in the
call's receipt and the learner scores the call's tokens under it.
A re-run of the same call id that finds the arrays staged (an earlier attempt staged, then crashed
before returning) does not generate again: it verifies the staged prompt equals the prompt it was
asked for and returns the receipt of what is staged. Two racing attempts cannot mix up their
receipts: the loser's put_if_absent fails on the arrays, and it returns the winner's receipt, found
under the winner's arrays digest.

The response (decoded text, parsed chat message) returns inline when small; above
`inp.completion_inline_max` bytes it is stored beside the arrays and returned as a reference
(capture/claims.py `stash_completion`), so a long completion never crosses Temporal.

The per-call seed is a pure function of (episode id, call id), so a retried generation samples the
same tokens where the engine is deterministic (same weights, same batch numerics).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from pydantic import BaseModel
from temporalio import activity

from activities.engine import Generation, PolicyEngine
from activities.follow import check_served_version
from capture.claims import by_reference, completion_of, stash_completion, stash_conversation
from capture.prompt import build_prompt, resolve_chat_ref
from chat.tool_parsers import ToolCallParser
from chat.toolcalls import ParsedAssistant
from grove.contracts import ChatPrompt, Completion, Conversation, GenerateInput, GenerateResult
from grove.receipts import ToolCallOutcome
from grove.sampling import SamplingProcessing
from grove.staging_format import CallTokens, decode_call_tokens, encode_call_tokens
from grove.store_layout import staged_receipt_key, staging_key
from storage.base import DigestMismatchError, ObjectNotFoundError, ObjectStore, sha256_hex

HEARTBEAT_SECONDS = 5.0  # the episode workflow's heartbeat timeout is 20 s


class StagedCallConflictError(RuntimeError):
    """The call id is already staged with a different prompt, or its staged receipt is missing."""


class StagedReceipt(BaseModel):
    """What a call's arrays do not hold; stored beside them under the arrays' digest."""

    episode_id: str
    call_id: str
    policy_version: int
    finish_reason: str
    sampling: SamplingProcessing | None = None  # None: staged before sampling was recorded


def call_seed(episode_id: str, call_id: str) -> int:
    """Sampling seed of a call: a pure function of its ids (31 bits: valid for every backend's RNG)."""
    digest = hashlib.sha256(f"{episode_id}\x00{call_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**31 - 1)


def tool_call_id_prefix(episode_id: str, call_id: str) -> str:
    """Deterministic tool-call ids for a call's response (the same on every retry)."""
    return "call_" + hashlib.sha256(f"{episode_id}/{call_id}".encode()).hexdigest()[:16]


# ---- prompt -------------------------------------------------------------------------------------


# ---- result -------------------------------------------------------------------------------------


def _result(
    inp: GenerateInput,
    engine: PolicyEngine,
    store: ObjectStore,
    tokens: CallTokens,
    receipt: StagedReceipt,
    reused: bool,
    tools: list[dict[str, Any]] | None = None,
) -> GenerateResult:
    text = engine.decode_completion(tokens.completion_ids, inp.sampling)
    # The model family's parser (EngineConfig.tool_call_parser); the staged tokens are already final.
    parsed = assistant_of(engine.tool_parser, text, tool_call_id_prefix(inp.episode_id, inp.call_id), tools)
    ids = tokens.completion_ids.tolist()
    completion = Completion(text=text, assistant_message=parsed.message())
    # A large completion goes by claim check (deterministic key and bytes: a re-run verifies its own).
    if by_reference(ids, completion, inp.completion_inline_max):
        ref = stash_completion(store, inp.episode_id, inp.call_id, completion)
        carried: dict[str, Any] = {"completion_ref": ref}
    else:
        carried = {"completion_ids": ids, **completion.model_dump()}
    return GenerateResult(
        call_id=inp.call_id,
        staging_key=staging_key(inp.episode_id, inp.call_id),
        digests=tokens.digests(),
        **carried,
        finish_reason=receipt.finish_reason,
        policy_version=receipt.policy_version,
        reused_staged=reused,
        sampling=receipt.sampling,
        tool_call=tool_call_outcome(parsed, tools),
    )


def assistant_of(
    parser: ToolCallParser, text: str, id_prefix: str, tools: list[dict[str, Any]] | None
) -> ParsedAssistant:
    """The reply to a completion: tool calls parsed when the request offered tools, else the text alone.

    As vLLM's OpenAI server answers: a client cannot run a tool it did not offer. (Claude Code answered
    "No such tool" to a tool-less subagent's made-up call turn after turn, until the episode's deadline.)
    """
    return parser.parse(text, id_prefix=id_prefix, tools=tools) if tools else ParsedAssistant(text)


def tool_call_outcome(parsed: ParsedAssistant, tools: list[dict[str, Any]] | None) -> ToolCallOutcome | None:
    """How a completion parsed, for a request that offered tools (None when it offered none)."""
    if not tools:
        return None
    if parsed.tool_calls:
        return ToolCallOutcome.WELL_FORMED
    return ToolCallOutcome.MALFORMED if parsed.malformed else ToolCallOutcome.NONE


def staged_result(
    inp: GenerateInput,
    engine: PolicyEngine,
    store: ObjectStore,
    prompt: np.ndarray,
    tools: list[dict[str, Any]] | None = None,
):
    """The result of an already staged call (None if the call is not staged)."""
    key = staging_key(inp.episode_id, inp.call_id)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    tokens = decode_call_tokens(data, key=key)
    if not np.array_equal(tokens.prompt_ids, prompt):
        raise StagedCallConflictError(
            f"call {inp.call_id} of episode {inp.episode_id} is already staged at {key!r} with a different "
            f"prompt ({tokens.prompt_ids.size} tokens vs {prompt.size} asked); a call id names one prompt "
            "forever: admit the new prompt under a new call id"
        )
    rkey = staged_receipt_key(inp.episode_id, inp.call_id, sha256_hex(data))
    try:
        receipt = StagedReceipt.model_validate_json(store.get(rkey))
    except ObjectNotFoundError:
        raise StagedCallConflictError(
            f"call {inp.call_id}: arrays are staged at {key!r} but their receipt {rkey!r} is missing; the "
            "object was not written by the generate activity. Inspect it, then delete it to regenerate"
        ) from None
    return _result(inp, engine, store, tokens, receipt, reused=True, tools=tools)


def stage(
    inp: GenerateInput,
    engine: PolicyEngine,
    store: ObjectStore,
    gen: Generation,
    prompt: np.ndarray,
    tools: list[dict[str, Any]] | None = None,
):
    """Write receipt then arrays; a lost race returns the winner's staged result."""
    tokens = CallTokens.of(gen.prompt_ids, gen.completion_ids, gen.logprobs)
    data = encode_call_tokens(tokens)
    receipt = StagedReceipt(
        episode_id=inp.episode_id,
        call_id=inp.call_id,
        policy_version=gen.policy_version,
        finish_reason=gen.finish_reason,
        sampling=inp.sampling.processing(),  # what engine.generate was called with, exactly
    )
    rkey = staged_receipt_key(inp.episode_id, inp.call_id, sha256_hex(data))
    store.put_if_absent(rkey, json.dumps(receipt.model_dump(mode="json"), sort_keys=True).encode())
    try:
        store.put_if_absent(staging_key(inp.episode_id, inp.call_id), data)
    except DigestMismatchError:
        return staged_result(inp, engine, store, prompt, tools)  # another attempt staged first
    return _result(inp, engine, store, tokens, receipt, reused=False, tools=tools)


# ---- activity -----------------------------------------------------------------------------------


@asynccontextmanager
async def heartbeating(details: dict[str, Any], every: float = HEARTBEAT_SECONDS):
    """Heartbeat `details` now and every `every` s while the body runs; yields `phase(name, **more)`,
    which updates the details and heartbeats at once (what the UI shows of a call in flight)."""
    current = dict(details)

    def phase(name: str, **more: Any) -> None:
        current.update(more, phase=name)
        if activity.in_activity():
            activity.heartbeat(dict(current))

    async def beat() -> None:
        while activity.in_activity():
            activity.heartbeat(dict(current))
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield phase
    finally:
        task.cancel()


async def run_generate(inp: GenerateInput, engine: PolicyEngine, store: ObjectStore) -> GenerateResult:
    """Body of the generate activity (store I/O off the event loop that drives the engine).

    It heartbeats from its first line to its last, not only while the engine generates: the episode
    takes 20 s without a heartbeat for a dead worker (a lost attempt: discarded and re-admitted), and
    the store reads, the prompt build and the staging writes (fsyncs) run in threads that a loaded
    machine can stall for that long while the worker is alive. (The 20,000-call bench lost one call
    that way: docs/reliability.md.) Only a worker whose event loop stops stops heartbeating."""
    async with heartbeating({"call_id": inp.call_id, "phase": "preparing"}) as phase:
        spec = await asyncio.to_thread(resolve_chat_ref, inp.prompt, inp.episode_id, store)
        stop_ids = engine.stop_ids(inp.sampling)
        prompt = await asyncio.to_thread(
            build_prompt, spec, inp.episode_id, store, engine.tokenizer, stop_ids, engine.tool_parser
        )
        tools = spec.chat.tools if spec.chat is not None else None  # some parsers type arguments by them
        staged = await asyncio.to_thread(staged_result, inp, engine, store, prompt, tools)
        if staged is not None:
            return await asyncio.to_thread(with_conversation, inp, spec.chat, store, staged)
        attempt = activity.info().attempt if activity.in_activity() else 1
        request_id = f"{inp.episode_id}/{inp.call_id}/attempt-{attempt}"
        phase("generating", prompt_len=int(prompt.size))
        gen = await engine.generate(prompt, inp.sampling, call_seed(inp.episode_id, inp.call_id), request_id)
        if inp.policy is not None:  # a capped call (an evaluation) another call's load overtook: not staged
            check_served_version(inp.policy, gen.policy_version, f"generate call {inp.call_id}")
        phase("staging", completion_len=int(gen.completion_ids.size))
        result = await asyncio.to_thread(stage, inp, engine, store, gen, prompt, tools)
        return await asyncio.to_thread(with_conversation, inp, spec.chat, store, result)


def with_conversation(
    inp: GenerateInput, chat: ChatPrompt | None, store: ObjectStore, result: GenerateResult
) -> GenerateResult:
    """A native chat call's result with its Conversation stored (the prompt's messages and tools, the
    reply its caller gets), so its continuation sends only its new messages (`ChatDelta`): the history
    then grows by what each call adds, not by the whole conversation again per call. Only for prompts
    the native harness sends (`chat`, `chat_delta`); the gateway's (`chat_ref`) have their chat record."""
    if chat is None or (inp.prompt.chat is None and inp.prompt.chat_delta is None):
        return result
    response = completion_of(store, inp.episode_id, result).assistant_message
    conversation = Conversation(messages=chat.messages, tools=chat.tools, response=response)
    return result.model_copy(
        update={"conversation_ref": stash_conversation(store, inp.episode_id, inp.call_id, conversation)}
    )
