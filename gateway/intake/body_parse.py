"""Decoding and checking a large chat body in a worker process, so that it never holds the gateway's loop.

`json.loads` of a body of several MB holds the GIL for all of its milliseconds (a thread would not free the
loop), and the checks after it (gateway/intake/limits.py: depth and text; counts; the request model; the
completion budget) walk the whole value. A large body admitted by gateway/intake/large_bodies.py is handed as
bytes to a pool of `processes` spawned, niced worker processes (light: no tokenizer, no torch), which run the
same checks the event loop runs on a small body, in the same order, plus the prompt's lower bound
(gateway/intake/tokenization.py `PromptBound`, built by the gateway from its tokenizer), and send back either
the refusal (the same error class, message and param) or the validated request. Each wire format gives
its own checks (`BodyCheck`: a module-level function, so that it pickles; `check_chat_body` for chat
completions, `check_responses_body` for the Responses API) and the bound measures its canonical
messages. So an over-long prompt comes back as a few hundred bytes, and the gateway's own work per
large body is reading it.

Test gate (grove/gates.py): `body_parse` (key: the episode id) holds a body's decoding in the worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool

from gateway.intake.capture_request import WireRequest
from gateway.intake.chat_request import ChatCompletionRequest, parse_chat_request
from gateway.intake.context_window import ContextLengthExceededError, check_max_tokens
from gateway.intake.limits import RequestLimits, TooManyItemsError, check_counts, parse_json
from gateway.intake.responses_chat import AcceptedResponses, accept
from gateway.intake.responses_request import parse_responses_request
from gateway.intake.tokenization import PromptBound
from gateway.intake.worker_pool import WorkerPool
from grove.gates import Gates

NICE = 10  # workers yield the CPU to the gateway's loop, Temporal and the engines

# A wire format's body checks: (raw body, limits, served model, max_model_len) -> its validated request.
BodyCheck = Callable[[bytes, RequestLimits, str, int], WireRequest]


class BodyWorkerLostError(Exception):
    """The worker process decoding this body died (killed): HTTP 503, Retry-After; a new one serves the
    retry."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def check_chat_body(
    raw: bytes, limits: RequestLimits, served_model: str, max_model_len: int
) -> ChatCompletionRequest:
    """A chat body's checks before admission, in order; the first problem raises its RequestError."""
    body = parse_json(raw, limits)
    if isinstance(body, dict):
        check_counts(body, limits)
    chat = parse_chat_request(body, served_model)
    check_max_tokens(chat, max_model_len)
    return chat


_BOUND: PromptBound | None = None  # the worker's copy of the gateway's bound, set by _start_worker


def check_responses_body(
    raw: bytes, limits: RequestLimits, served_model: str, max_model_len: int
) -> AcceptedResponses:
    """A Responses body's checks before admission, in order (gateway/intake/responses_request.py,
    responses_chat.py); the first problem raises its RequestError."""
    body = parse_json(raw, limits)
    if isinstance(body, dict):
        items = body.get("input")
        if isinstance(items, list) and len(items) > limits.max_messages:
            raise TooManyItemsError(
                f"the request has {len(items)} input items; this gateway accepts at most "
                f"{limits.max_messages} (max_messages = {limits.max_messages}). Compact the history",
                param="input",
            )
        check_counts({"tools": body.get("tools")}, limits)
    accepted = accept(parse_responses_request(body, served_model))
    check_max_tokens(accepted.request, max_model_len, params=("max_output_tokens",))
    return accepted


def _start_worker(bound: PromptBound | None) -> None:
    global _BOUND
    os.nice(NICE)
    _BOUND = bound


def _known_messages(request: WireRequest) -> list[dict]:
    """The messages the request holds itself: all of them, or, for a Responses request continuing a
    previous response whose history is read later, its own items (a lower bound of its prompt too)."""
    if isinstance(request, AcceptedResponses) and request.pending:
        return request.form.messages
    return request.canonical().messages


def _parse_in_worker(
    check: BodyCheck,
    episode_id: str,
    raw: bytes,
    limits: RequestLimits,
    served_model: str,
    max_model_len: int,
) -> WireRequest | ContextLengthExceededError:
    gates = Gates.from_env()
    if gates is not None:  # tests only: hold a body's decoding in the worker
        gates.hold_sync("body_parse", episode_id)
    request = check(raw, limits, served_model, max_model_len)
    if _BOUND is not None:  # an over-long prompt goes back as its refusal, not as MBs of request
        try:
            _BOUND.check(_known_messages(request), max_model_len)
        except ContextLengthExceededError as refusal:
            return refusal
    return request


class BodyParser:
    """The worker pool decoding large bodies (module docstring). Its pool starts with the first large body,
    with the lower bound the gateway set by then (`bound`: None where the tokenizer gives none)."""

    def __init__(self, processes: int, retry_after: int) -> None:
        self.bound: PromptBound | None = None
        self.processes = processes
        self.retry_after = retry_after
        self._workers: WorkerPool | None = None  # started with the bound, once it is set

    def shutdown(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()

    async def parse(
        self,
        episode_id: str,
        raw: bytes,
        limits: RequestLimits,
        served_model: str,
        max_model_len: int,
        check: BodyCheck = check_chat_body,
    ) -> WireRequest | ContextLengthExceededError:
        """The validated request (by the wire format's `check`), or the lower bound's refusal of its prompt
        (returned: the caller raises it after its own checks that come first); a RequestError of the body
        raised here as the worker raised it."""
        if self._workers is None:
            self._workers = WorkerPool(self.processes, _start_worker, (self.bound,))
        try:
            return await self._workers.run(
                _parse_in_worker, check, episode_id, raw, limits, served_model, max_model_len
            )
        except BrokenProcessPool:  # a worker died: a new pool serves the retry
            raise BodyWorkerLostError(
                f"episode {episode_id!r}: the gateway's worker process decoding this {len(raw)}-byte body "
                f"died; retry in {self.retry_after} s",
                retry_after=self.retry_after,
            ) from None
