"""One chat request of an external harness, captured: route it to its context, decide how it relates to
the context's head, admit it through the episode's Updates, and record what the harness got.

    spec      -> sampling (the episode's, with the request's overrides; 400 before anything runs)
    relaunch  -> a relaunched harness's request answered from an earlier launch's record, if one matches
                 (gateway/pipeline/relaunch.py, gateway/pipeline/launch_records.py)
    plan      -> view, identity, target context, spawn, head, decision (gateway/pipeline/planning.py, its
    spawn
                 rules gateway/pipeline/spawn_checks.py): nothing is admitted for a refused request
    run       -> fit, act, record (gateway/pipeline/execution.py): the call Update admits and generates it
    delivery  -> `Delivery`: the route asks the ledger whether it would take the delivery, sends the
                 response's last part, then records the delivery (the `deliver` Update) and settles it
                 (gateway/pipeline/delivery.py): not delivered -> the call is discarded, never trained; a
                 close freezes the rest (ledger/delivery.py)

Delivery and its races. A call's response is "being delivered" from its call Update until the route has sent
its last byte or given up; this gateway process knows which of its own requests are in that window
(gateway/pipeline/capture_state.py: liveness, not state: nothing there outlives the request). Another request
of the same context in that window gets a retryable 409 instead of a decision on a head that may be about to
be delivered (it must not discard it); once the last part went out, it goes ahead and extends the head.
Several gateway replicas do not share that knowledge: route all requests of an episode to one replica (the
episode reference is in the path). At close the ledger itself discards every completed call whose delivery it
has not recorded (ledger/delivery.py).

Planning is serialised per episode within this gateway process (`_planning`): from the view query
to the registration of the new call id, so two concurrent first requests of a worker spawned twice see
each other's new context and open two, never one twice. Generation runs outside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from capture.records import ChatRecord
from gateway.intake.chat_request import ChatCompletionRequest, sampling_for
from gateway.pipeline.capture_errors import UndeliveredHeadsError
from gateway.pipeline.capture_state import CaptureState
from gateway.pipeline.delivery import Delivery
from gateway.pipeline.execution import admit, prepare
from gateway.pipeline.launch_records import launch_of
from gateway.pipeline.planning import plan
from gateway.pipeline.relaunch import replay
from grove.headers import AGENT_HEADER

MAX_RECOVERIES = 3  # undelivered heads discarded before giving up on one request


class Capture(CaptureState):
    """Captures chat requests into episode workflows; stateless (Temporal + object store), apart from
    knowing which of its own requests are still delivering a response."""

    async def chat(
        self, episode_id: str, request: ChatCompletionRequest, headers: Mapping[str, str]
    ) -> ChatRecord:
        """Capture one request and hand its record (what the harness gets) straight to the caller: it is
        delivered once this returns. HTTP routes use `chat_delivery` and settle after sending."""
        delivery = await self.chat_delivery(episode_id, request, headers)
        delivered = False
        try:
            await delivery.commit()
            delivered = True
        finally:
            await delivery.settle(delivered)
        return delivery.record

    async def chat_delivery(
        self, episode_id: str, request: ChatCompletionRequest, headers: Mapping[str, str]
    ) -> Delivery:
        """Capture one request; returns its delivery, which the caller must `settle` once the response
        was sent (or not)."""
        launch = launch_of(headers)
        if self.tokens is not None:  # a prompt whose text alone cannot fit: refused before anything else
            await asyncio.to_thread(self.tokens.refuse_unfit, request.messages)
        if self.gates is not None:  # tests: a harness's request arrived, nothing is decided yet
            await self.gates.hold("chat_request", request_gate_key(episode_id, launch, headers, request))
        spec = await self.episodes.spec(episode_id)
        sampling = sampling_for(request, spec.sampling)
        if launch is not None and launch > 1:
            async with self._replay_lock(episode_id):
                replayed = await replay(self, episode_id, request, headers, launch)
            if replayed is not None:
                return replayed
        async with self._planning(episode_id):
            for _ in range(MAX_RECOVERIES):
                planned = await plan(self, episode_id, request, headers, launch, spec)
                if planned is not None:
                    break
            else:
                raise UndeliveredHeadsError(
                    f"episode {episode_id!r}: {MAX_RECOVERIES} heads in a row were never delivered (no chat "
                    "record, or no delivery recorded in the ledger); check the gateway's object store and "
                    "its log, then retry the request"
                )
            call = await prepare(self, episode_id, request, planned, sampling, sampling or spec.sampling)
        return await admit(self, episode_id, request, planned, call, launch)

    @asynccontextmanager
    async def _planning(self, episode_id: str) -> AsyncIterator[None]:
        """One request of the episode plans at a time in this process (see the module docstring)."""
        lock, users = self._plan_locks.get(episode_id, (asyncio.Lock(), 0))
        self._plan_locks[episode_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._plan_locks[episode_id]
            if users <= 1:
                del self._plan_locks[episode_id]
            else:
                self._plan_locks[episode_id] = (lock, users - 1)

    def _replay_lock(self, episode_id: str) -> asyncio.Lock:
        return self._replay_locks.setdefault(episode_id, asyncio.Lock())


def request_gate_key(
    episode_id: str, launch: int | None, headers: Mapping[str, str], request: ChatCompletionRequest
) -> str:
    """Key of the `chat_request` test gate: `{episode}/{launch or 0}/{x-grove-agent or -}/{n messages}`."""
    return f"{episode_id}/{launch or 0}/{headers.get(AGENT_HEADER, '-')}/{len(request.messages)}"
