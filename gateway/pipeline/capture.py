"""One request of an external harness, captured: route it to its context, decide how it relates to the
context's head, admit it through the episode's Updates, and record what the harness got.

The pipeline takes the canonical request (gateway/intake/capture_request.py `CaptureRequest`: the
messages in the policy's chat form, tools, sampling overrides), whichever wire format carried it, and
gives back a `Delivery` of the call's chat record (capture/records.py): the wire format's route renders
that record in its own shape and settles the delivery.

    spec      -> sampling (the episode's, with the request's overrides; 400 before anything runs)
    replay    -> a relaunched harness's request answered from an earlier launch's record, if one matches
                 (`Relaunch`, gateway/pipeline/relaunch.py; gateway/pipeline/launch_records.py)
    plan      -> view, identity, target context, spawn, head, decision (`Planner`,
                 gateway/pipeline/planning.py; its spawn rules gateway/pipeline/spawn_checks.py): nothing is
                 admitted for a refused request
    execute   -> fit, act, record (`Execution`, gateway/pipeline/execution.py): the call Update admits and
                 generates it
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
from gateway.intake.capture_request import CaptureRequest, WireRequest
from gateway.intake.context_window import ContextWindow
from gateway.intake.tokenization import Tokenization
from gateway.pipeline.capture_errors import UndeliveredHeadsError
from gateway.pipeline.capture_state import CaptureState
from gateway.pipeline.delivery import Delivery
from gateway.pipeline.execution import Execution
from gateway.pipeline.launch_records import launch_of
from gateway.pipeline.planning import Plan, Planner
from gateway.pipeline.relaunch import Relaunch
from gateway.temporal.episode_client import Episodes
from grove.contracts import EpisodeSpec
from grove.headers import AGENT_HEADER
from storage.base import ObjectStore

MAX_RECOVERIES = 3  # undelivered heads discarded before giving up on one request


class Capture(CaptureState):
    """The capture pipeline: captures requests into episode workflows (replay, plan, execute); stateless
    (Temporal + object store), apart from knowing which of its own requests are still delivering a
    response."""

    def __init__(
        self,
        episodes: Episodes,
        store: ObjectStore,
        window: ContextWindow | None = None,
        tokens: Tokenization | None = None,
    ) -> None:
        super().__init__(episodes, store, window, tokens)
        self.relaunch = Relaunch(self)
        self.planner = Planner(self, self.relaunch)
        self.execution = Execution(self)
        self._plan_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # episode -> (lock, requests using it)

    async def chat(self, episode_id: str, request: WireRequest, headers: Mapping[str, str]) -> ChatRecord:
        """Capture one request and hand its record (what the harness gets) straight to the caller: it is
        delivered once this returns. HTTP routes use `delivery` and settle after sending."""
        delivery = await self.delivery(episode_id, request.canonical(), headers)
        delivered = False
        try:
            await delivery.commit()
            delivered = True
        finally:
            await delivery.settle(delivered)
        return delivery.record

    async def delivery(
        self, episode_id: str, request: CaptureRequest, headers: Mapping[str, str]
    ) -> Delivery:
        """Capture one request; returns its delivery, which the caller must `settle` once the response
        was sent (or not)."""
        launch = launch_of(headers)
        if self.tokens is not None:  # a prompt whose text alone cannot fit: refused before anything else
            await asyncio.to_thread(self.tokens.refuse_unfit, request.messages)
        if self.gates is not None:  # tests: a harness's request arrived, nothing is decided yet
            await self.gates.hold("chat_request", request_gate_key(episode_id, launch, headers, request))
        spec = await self.episodes.spec(episode_id)
        sampling = request.overrides.apply(spec.sampling)
        if launch is not None and launch > 1:
            async with self.relaunch.lock(episode_id):
                replayed = await self.relaunch.replay(episode_id, request, headers, launch)
            if replayed is not None:
                return replayed
        async with self._planning(episode_id):
            planned = await self._plan(episode_id, request, headers, launch, spec)
            effective = sampling or spec.sampling
            call = await self.execution.prepare(episode_id, request, planned, sampling, effective)
        return await self.execution.admit(episode_id, request, planned, call, launch)

    async def _plan(
        self,
        episode_id: str,
        request: CaptureRequest,
        headers: Mapping[str, str],
        launch: int | None,
        spec: EpisodeSpec,
    ) -> Plan:
        """The request's plan, planning again after each undelivered head the planner discarded."""
        for _ in range(MAX_RECOVERIES):
            planned = await self.planner.plan(episode_id, request, headers, launch, spec)
            if planned is not None:
                return planned
        raise UndeliveredHeadsError(
            f"episode {episode_id!r}: {MAX_RECOVERIES} heads in a row were never delivered (no chat "
            "record, or no delivery recorded in the ledger); check the gateway's object store and "
            "its log, then retry the request"
        )

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


def request_gate_key(
    episode_id: str, launch: int | None, headers: Mapping[str, str], request: CaptureRequest
) -> str:
    """Key of the `chat_request` test gate: `{episode}/{launch or 0}/{x-grove-agent or -}/{n messages}`."""
    return f"{episode_id}/{launch or 0}/{headers.get(AGENT_HEADER, '-')}/{len(request.messages)}"
