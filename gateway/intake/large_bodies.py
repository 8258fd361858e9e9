"""Admission of large chat bodies: a flood of big requests from one episode costs the gateway one body at a
time, and nothing at all while it waits.

Reading and decoding a body of several MB costs the gateway milliseconds of CPU per request (the socket
reads, the JSON decode), and a client can send such bodies as fast as the gateway takes them. So a body
of at least `large_from` bytes (by its Content-Length; a chunked body counts as the largest allowed) is
admitted before a byte of it is read:

- per episode, `per_episode` large bodies are read and parsed at once; the others wait their turn in
  arrival order, their bytes left in the socket (TCP holds the client back: waiting costs neither side
  any CPU);
- per episode, at most `max_waiting` wait; one more is refused at once with 429 `LargeBodyBacklogError`
  and `Retry-After`, before its body is read or decoded (the server still receives and drops the rest of
  it: closing the connection instead loses the answer for a client still sending);
- over all episodes, at most `max_bytes_in_progress` bytes of large bodies are being read or parsed at
  once (one body alone always is); the others wait. So the gateway's memory for bodies is bounded by
  that cap, not by how many large requests arrive, and another episode's requests (small ones never
  wait here) keep the event loop.

The body of an admitted large request is decoded and checked in a worker process
(gateway/intake/body_parse.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import BaseModel, ConfigDict, Field

MiB = 2**20


class BodyAdmissionLimits(BaseModel):
    """How the gateway admits large chat bodies (module docstring); `GatewaySettings.bodies`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    large_from: int = Field(64 * 1024, ge=0)  # smaller bodies are read and parsed on the event loop at once
    per_episode: int = Field(1, ge=1)  # large bodies of one episode read and parsed at once
    max_waiting: int = Field(8, ge=0)  # large bodies of one episode waiting their turn; beyond: 429
    max_bytes_in_progress: int = Field(32 * MiB, ge=1024)  # large-body bytes read or parsed at once
    processes: int = Field(
        1, ge=1, le=64
    )  # worker processes decoding large bodies (gateway/intake/body_parse.py)
    retry_after: int = Field(1, ge=1)  # seconds, the Retry-After of LargeBodyBacklogError


class LargeBodyBacklogError(Exception):
    """Too many large bodies of one episode are waiting to be read (HTTP 429, Retry-After): retry shortly,
    or send fewer large requests at once."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _EpisodeQueue:
    def __init__(self, slots: int) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.waiting = 0
        self.users = 0  # requests holding or waiting for a slot: the queue is dropped at 0


class BodyAdmission:
    """The per-episode turns and the overall byte budget of large bodies (module docstring)."""

    def __init__(self, limits: BodyAdmissionLimits | None = None) -> None:
        self.limits = limits or BodyAdmissionLimits()
        self.in_progress = 0  # bytes of large bodies being read or parsed now
        self._episodes: dict[str, _EpisodeQueue] = {}
        self._budget_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def is_large(self, size: int | None) -> bool:
        """Whether a body of `size` bytes (None: unknown, chunked) is admitted here."""
        return size is None or size >= self.limits.large_from

    def waiting(self, episode_id: str) -> int:
        """Large bodies of this episode waiting for their turn."""
        queue = self._episodes.get(episode_id)
        return 0 if queue is None else queue.waiting

    @property
    def waiting_for_budget(self) -> int:
        """Large bodies holding their episode's turn, waiting for bytes of the overall budget."""
        return len(self._budget_waiters)

    @asynccontextmanager
    async def turn(self, episode_id: str, size: int) -> AsyncIterator[None]:
        """Hold this episode's turn and `size` bytes of the budget while the body is read and parsed;
        LargeBodyBacklogError at once when the episode already has `max_waiting` bodies waiting."""
        queue = self._episodes.setdefault(episode_id, _EpisodeQueue(self.limits.per_episode))
        if queue.slots.locked() and queue.waiting >= self.limits.max_waiting:
            self._drop_if_unused(episode_id, queue)
            raise self._backlog(episode_id, size, queue.waiting)
        queue.users += 1
        try:
            queue.waiting += 1
            try:
                await queue.slots.acquire()
            finally:
                queue.waiting -= 1
            try:
                await self._take(size)
                try:
                    yield
                finally:
                    self._give(size)
            finally:
                queue.slots.release()
        finally:
            queue.users -= 1
            self._drop_if_unused(episode_id, queue)

    def _drop_if_unused(self, episode_id: str, queue: _EpisodeQueue) -> None:
        if queue.users <= 0 and self._episodes.get(episode_id) is queue:
            del self._episodes[episode_id]

    async def _take(self, size: int) -> None:
        """Wait (in arrival order) until `size` more bytes fit the budget; a body alone always fits."""
        if not self._budget_waiters and self._fits(size):
            self.in_progress += size
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._budget_waiters.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._give(size)  # granted as it was cancelled: hand the bytes on
            else:
                self._budget_waiters.remove(entry)
                self._grant()
            raise

    def _fits(self, size: int) -> bool:
        return self.in_progress == 0 or self.in_progress + size <= self.limits.max_bytes_in_progress

    def _give(self, size: int) -> None:
        self.in_progress -= size
        self._grant()

    def _grant(self) -> None:
        while self._budget_waiters and self._fits(self._budget_waiters[0][0]):
            size, granted = self._budget_waiters.popleft()
            self.in_progress += size
            granted.set_result(None)

    def _backlog(self, episode_id: str, size: int, waiting: int) -> LargeBodyBacklogError:
        limits = self.limits
        return LargeBodyBacklogError(
            f"episode {episode_id!r} already has {waiting} large request bodies (of at least "
            f"{limits.large_from} bytes) waiting to be read, the most it may (GatewaySettings.bodies."
            f"max_waiting = {limits.max_waiting}); this request's {size} bytes were not read. Retry in "
            f"{limits.retry_after} s, or send fewer large requests at once (compact the history)",
            retry_after=limits.retry_after,
        )
