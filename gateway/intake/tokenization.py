"""Measuring a request's prompt without blocking the gateway, in bounded memory.

Every chat request's prompt is built and counted before admission (gateway/intake/context_window.py). Done on
the event loop's threads, that work would block the gateway: concurrent multi-MB over-long prompts of one
episode refused one after another (the planning lock and the GIL), the gateway's memory growing by GBs,
and another episode's calls slowed many times over (docs/results.md has the figures). So:

1. **A lower bound first, from the text alone** (`PromptBound`): a byte-level BPE token (or a byte-fallback
   one) covers at most `bytes_per_token` bytes of its (normalized) text, the longest token of the
   vocabulary, so a prompt has at least `text bytes / bytes_per_token` tokens, counting only the message
   roles the chat template renders verbatim (checked at startup by rendering marked messages: user, system,
   tool). When that bound already fills the context, the request is refused (400
   `context_length_exceeded`, "at least N tokens") before anything else, without tokenizing: in
   microseconds per MB, in parallel, outside the episode's planning. Tokenizers the bound does not hold for
   (WordPiece, Unigram) get no bound; every prompt is then measured exactly.
2. **The exact count off the event loop** (`Tokenization.check`): prompts under `in_process_below` bytes
   are built in a thread (milliseconds); larger ones in a pool of `processes` worker processes (spawned:
   their own GIL; niced, so the gateway's loop and the engines keep the CPU), each with the model's
   tokenizer. A continuation's parent arrays are read by the gateway and handed to the worker. The pool
   starts with its first large prompt (a worker is heavy: transformers imports torch), or at
   `start()`; one process by default. Like any `spawn` pool it imports the program's main module again
   in each worker: a script that serves a gateway keeps its work under `if __name__ == "__main__":`.
3. **A cap on bytes being measured at once** (`max_bytes`): a request that would pass it while others are
   measured gets 503 `TokenizerBusyError` with `Retry-After` (the OpenAI clients retry it); one request
   alone is always measured (the lower bound keeps its text within `bytes_per_token` x the context for the
   verbatim roles). So the gateway's memory for measuring is bounded by the cap, not by how many large
   requests arrive.

Test gate (grove/gates.py): `tokenize` (key `{episode id}/{context id}`) holds an exact measurement in the
pool's worker process.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.intake.context_window import ContextLengthExceededError, ContextWindow
from gateway.intake.worker_pool import WorkerPool
from grove.contracts import PromptSpec
from grove.gates import Gates
from grove.sampling import SamplingConfig
from storage.base import ObjectInfo, ObjectNotFoundError, ObjectStore, PutOutcome

MiB = 2**20
NICE = 10  # pool workers yield the CPU to the gateway's loop, Temporal and the engines
PROBE = "grove-verbatim-probe-{role}-7f3a9c"


class TokenizationLimits(BaseModel):
    """How the gateway measures prompts (module docstring); `GatewaySettings.tokenization`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    processes: int = Field(1, ge=1, le=64)  # worker processes of the pool
    in_process_below: int = Field(64 * 1024, ge=0)  # smaller prompts are built in a thread of the gateway
    max_bytes: int = Field(16 * MiB, ge=1024)  # prompt bytes being measured at once, beyond: 503
    retry_after: int = Field(1, ge=1)  # seconds, the Retry-After of TokenizerBusyError


class TokenizerBusyError(Exception):
    """Too many prompt bytes are being measured at once (HTTP 503, Retry-After): retry shortly."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# ---------------------------------------------------------------------------------------------- bound


@dataclass(frozen=True)
class PromptBound:
    """A lower bound on a prompt's token count from its text (module docstring, point 1)."""

    bytes_per_token: int
    roles: frozenset[str]  # roles whose string content the chat template renders verbatim
    normalizer: Any | None  # the tokenizer's normalizer: the bound counts the bytes it tokenizes

    @classmethod
    def of(cls, tokenizer: Any) -> PromptBound | None:
        """The bound of this tokenizer and template, or None where it would not hold."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not _bytes_per_token_holds(json.loads(backend.to_str())):
            return None
        roles = _verbatim_roles(tokenizer)
        if not roles:
            return None
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        widest = max(len(t.encode()) for t in tokens if t)  # UTF-8 of a byte-level piece: >= its bytes
        return cls(widest, roles, backend.normalizer)

    def tokens_at_least(self, messages: Sequence[dict[str, Any]]) -> int:
        total = 0
        for message in messages:
            content = message.get("content")
            if message.get("role") in self.roles and isinstance(content, str):
                text = self.normalizer.normalize_str(content) if self.normalizer is not None else content
                total += len(text.encode("utf-8", "surrogatepass"))
        return math.ceil(total / self.bytes_per_token)

    def check(self, messages: Sequence[dict[str, Any]], max_model_len: int) -> None:
        """ContextLengthExceededError when the bound alone leaves no room for a generated token."""
        n = self.tokens_at_least(messages)
        if n >= max_model_len:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, your messages "
                f"resulted in at least {n} tokens (their text alone), which leaves no room for a "
                "completion. Please reduce the length of the messages (compact the history)",
                param="messages",
            )


def _bytes_per_token_holds(config: dict[str, Any]) -> bool:
    """BPE over bytes (a ByteLevel pre-tokenizer, or byte fallback): every byte of the normalized text is
    in some token, so no token stands for more bytes than its own length."""
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        return False
    return bool(model.get("byte_fallback")) or '"ByteLevel"' in json.dumps(config.get("pre_tokenizer"))


def _verbatim_roles(tokenizer: Any) -> frozenset[str]:
    """Roles whose marked content appears unchanged in the template's text, with tools and without."""
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": {}}}
    cases: dict[str, list[dict[str, Any]]] = {
        "system": [
            {"role": "system", "content": PROBE.format(role="system")},
            {"role": "user", "content": "x"},
        ],
        "user": [{"role": "user", "content": PROBE.format(role="user")}],
        "tool": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": PROBE.format(role="tool")},
        ],
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    return frozenset(
        role
        for role, messages in cases.items()
        if all(_renders_once(tokenizer, messages, tools, PROBE.format(role=role)) for tools in (None, [tool]))
    )


def _renders_once(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, marker: str) -> bool:
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: that role is not counted
        return False
    return isinstance(text, str) and text.count(marker) == 1


# ---------------------------------------------------------------------------------------------- exact


class SnapshotStore(ObjectStore):
    """The few objects a worker process reads to build one prompt (a parent's staged arrays), handed to
    it by the gateway: read-only."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectNotFoundError(key) from None

    def stat(self, key: str) -> ObjectInfo | None:
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(key=key, size=len(data))

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def put(self, key: str, data: bytes) -> None:
        raise PermissionError(f"a prompt measurement writes nothing (key {key!r})")

    def put_if_absent(self, key: str, data: bytes) -> PutOutcome:
        raise PermissionError(f"a prompt measurement writes nothing (key {key!r})")

    def delete(self, key: str) -> None:
        raise PermissionError(f"a prompt measurement deletes nothing (key {key!r})")


_WINDOW: ContextWindow | None = None  # the worker process's own, loaded once by _start_worker


def _start_worker(policy_model: str, max_model_len: int) -> None:
    global _WINDOW
    os.nice(NICE)
    _WINDOW = ContextWindow.load(policy_model, max_model_len, SnapshotStore({}))


def _worker_count(
    key: str, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig, objects: dict[str, bytes]
) -> int:
    gates = Gates.from_env()
    if gates is not None:  # tests only: hold a measurement in the worker
        gates.hold_sync("tokenize", key)
    assert _WINDOW is not None, "the pool's initializer loads the tokenizer"
    return replace(_WINDOW, store=SnapshotStore(objects)).prompt_len(episode_id, prompt, sampling)


def _warm() -> bool:
    return _WINDOW is not None


def prompt_bytes(messages: Iterable[dict[str, Any]]) -> int:
    """What a request's messages weigh, for the cap: their string contents (the bulk of any prompt)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return total


class Tokenization:
    """The gateway's prompt measurements (module docstring): the bound, the exact count, the cap."""

    def __init__(
        self, window: ContextWindow, policy_model: str, limits: TokenizationLimits | None = None
    ) -> None:
        self.window = window
        self.limits = limits or TokenizationLimits()
        self.bound = PromptBound.of(window.tokenizer)
        self.measuring = 0  # prompt bytes being measured now
        self.policy_model = policy_model
        self._workers = WorkerPool(self.limits.processes, _start_worker, (policy_model, window.max_model_len))

    async def start(self) -> None:
        """Start the pool's workers and load their tokenizers now (else the first prompt of at least
        `in_process_below` bytes starts them: most gateways never need them)."""
        await asyncio.gather(*(self._workers.run(_warm) for _ in range(self.limits.processes)))

    def shutdown(self) -> None:
        self._workers.shutdown()

    def refuse_unfit(self, messages: Sequence[dict[str, Any]]) -> None:
        """The lower bound's refusal (ContextLengthExceededError), if the text alone cannot fit."""
        if self.bound is not None:
            self.bound.check(messages, self.window.max_model_len)

    async def check(self, key: str, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig) -> int:
        """The prompt's exact length, measured off the loop; ContextLengthExceededError when not even one
        token fits after it, TokenizerBusyError past the cap."""
        n = await self.measure(key, episode_id, prompt, sampling)
        self.window.refuse(n, prompt)
        return n

    async def measure(self, key: str, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig) -> int:
        """The prompt's exact length, measured off the loop (TokenizerBusyError past the cap)."""
        size = prompt_bytes(prompt.chat.messages) if prompt.chat is not None else 0
        self._reserve(size)
        try:
            if size < self.limits.in_process_below:
                n = await asyncio.to_thread(self.window.prompt_len, episode_id, prompt, sampling)
            else:
                n = await self._in_pool(key, episode_id, prompt, sampling)
        finally:
            self.measuring -= size
        return n

    async def _in_pool(self, key: str, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig) -> int:
        objects = await asyncio.to_thread(_parent_objects, self.window.store, prompt)
        try:
            return await self._workers.run(_worker_count, key, episode_id, prompt, sampling, objects)
        except BrokenProcessPool:  # a worker died (killed): a new pool serves the retry
            raise TokenizerBusyError(
                f"the gateway's tokenization worker died while measuring this prompt; retry in "
                f"{self.limits.retry_after} s",
                retry_after=self.limits.retry_after,
            ) from None

    def _reserve(self, size: int) -> None:
        cap = self.limits.max_bytes
        if self.measuring and self.measuring + size > cap:
            raise TokenizerBusyError(
                f"the gateway is measuring {self.measuring} bytes of prompts already; this request's "
                f"{size} bytes would pass its cap of {cap} (GatewaySettings.tokenization.max_bytes); "
                f"retry in {self.limits.retry_after} s",
                retry_after=self.limits.retry_after,
            )
        self.measuring += size


def _parent_objects(store: ObjectStore, prompt: PromptSpec) -> dict[str, bytes]:
    """The parent's staged arrays a continuation splices (read here: the worker has no store)."""
    key = prompt.parent_staging_key
    if key is None:
        return {}
    try:
        return {key: store.get(key)}
    except ObjectNotFoundError:
        return {}  # the worker raises the same ParentNotStagedError the gateway's own build would
