"""What the steps of capturing a request share (the `Planner`, `Execution` and `Relaunch` of
gateway/pipeline/planning.py, execution.py and relaunch.py, and each `Delivery`,
gateway/pipeline/delivery.py): the episodes' Temporal handles, the object store, the prompt-length checks,
and which calls this gateway process is still delivering (liveness, not state: gateway/pipeline/capture.py,
"Delivery and its races"). The gateway keeps no other state: Temporal and the object store hold the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from capture.records import ChatRecord, load_record
from gateway.intake.context_window import ContextWindow
from gateway.intake.tokenization import Tokenization
from gateway.temporal.episode_client import EpisodeError, Episodes
from grove.gates import Gates
from storage.base import ObjectStore

log = logging.getLogger("grove.gateway")


class CaptureState:
    """The episodes, the store, the prompt checks, the calls being delivered (module docstring)."""

    def __init__(
        self,
        episodes: Episodes,
        store: ObjectStore,
        window: ContextWindow | None = None,
        tokens: Tokenization | None = None,
    ) -> None:
        self.episodes = episodes
        self.store = store
        self.window = window  # None: prompt lengths are not checked here (the engine refuses, 502)
        self.tokens = tokens  # measures off the event loop, bounded (gateway/intake/tokenization.py)
        self._delivering: Counter[tuple[str, str]] = Counter()  # (episode, requested call id) -> requests
        # of those, the ones whose last part went out: set once their delivery is recorded (or refused)
        self._sent: dict[tuple[str, str], asyncio.Event] = {}
        self.gates = Gates.from_env()  # tests only (grove/gates.py): hold a request, a delivery

    def start_delivering(self, episode_id: str, call_id: str) -> None:
        self._delivering[(episode_id, call_id)] += 1

    def mark_sent(self, episode_id: str, requested: str) -> None:
        """The response's last part went out; its `deliver` is on its way (gateway/pipeline/delivery.py)."""
        self._sent.setdefault((episode_id, requested), asyncio.Event())

    async def deliveries_recorded(self, episode_id: str, patience: float) -> None:
        """Until every response of the episode this gateway sent has its delivery recorded (or refused),
        `patience` seconds at most: a harness closes right after its last response, and its close must
        not reach the ledger before that response's `deliver` (the close would discard it)."""
        waits = [asyncio.ensure_future(e.wait()) for (ep, _), e in self._sent.items() if ep == episode_id]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=patience)
            for wait in pending:
                wait.cancel()

    def release(self, episode_id: str, requested: str) -> None:
        key = (episode_id, requested)
        self._delivering[key] -= 1
        if self._delivering[key] <= 0:
            del self._delivering[key]
            sent = self._sent.pop(key, None)
            if sent is not None:
                sent.set()

    def delivering(self, episode_id: str, call_id: str) -> bool:
        """Whether a request of this gateway is still delivering `call_id` (or the lost-attempt retry
        `{requested}.r{n}` it completed as), its last part not sent yet."""
        return any(key not in self._sent for key in self._keys(episode_id, call_id))

    def sent(self, episode_id: str, call_id: str) -> bool:
        """Whether a request of this gateway sent the last part of `call_id` and is recording its
        delivery: the harness has the response (a call that extends it counts it delivered too)."""
        return any(key in self._sent for key in self._keys(episode_id, call_id))

    def _keys(self, episode_id: str, call_id: str) -> list[tuple[str, str]]:
        return [
            (ep, requested)
            for ep, requested in self._delivering
            if ep == episode_id and (call_id == requested or call_id.startswith(f"{requested}.r"))
        ]

    async def discard_quietly(self, episode_id: str, call_id: str, reason: str) -> None:
        """Discard a response nobody got; a refusal (already discarded, extended, ledger closed) is
        logged, not raised: the ledger's state then says the response was used or settled."""
        try:
            await self.episodes.discard(episode_id, call_id, reason)
        except EpisodeError as err:
            log.warning("episode %r: call %r not discarded (%s): %s", episode_id, call_id, reason, err)

    async def record(self, episode_id: str, call_id: str) -> ChatRecord | None:
        """The call's chat record (capture/records.py), None if it has none."""
        return await asyncio.to_thread(load_record, self.store, episode_id, call_id)
