"""The engine's version gate and its scheduler statistics.

The gate admits each generation under the policy version current at admission; a publication closes it
to new generations and drains the admitted ones before the weights change, so no call straddles two
versions. `BatchStats` keeps what vLLM's scheduler reported (how many calls ran together, prefix-cache
hits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchStats:
    """What vLLM's scheduler reported: proof that concurrent calls were batched, and prefix-cache use."""

    steps: int = 0  # engine steps with at least one running request
    max_running: int = 0
    running_hist: dict[int, int] = field(default_factory=dict)
    prefix_cache_hits: int = 0  # prompt tokens served from the prefix cache

    def record(self, running: int, cache_hits: int) -> None:
        self.prefix_cache_hits += cache_hits
        if running > 0:
            self.steps += 1
            self.max_running = max(self.max_running, running)
            self.running_hist[running] = self.running_hist.get(running, 0) + 1

    def reset(self) -> None:
        self.steps, self.max_running, self.running_hist, self.prefix_cache_hits = 0, 0, {}, 0


class VersionGate:
    """Admits generations under one version; a publication closes it and waits for admitted ones."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.admitted_total = 0  # generations admitted since start
        self._busy_s = 0.0  # seconds with at least one generation admitted (engine utilisation)
        self._busy_since: float | None = None
        self._active = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[int]:
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self.admitted_total += 1
        if self._active == 1:
            self._busy_since = time.monotonic()
        self._idle.clear()
        try:
            yield self.version
        finally:
            self._active -= 1
            if self._active == 0:
                self._busy_s += time.monotonic() - (self._busy_since or time.monotonic())
                self._busy_since = None
                self._idle.set()

    @property
    def busy_seconds(self) -> float:
        """Seconds during which at least one generation was admitted (so far, including now)."""
        open_s = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_s + open_s

    @property
    def active(self) -> int:
        return self._active

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def close_and_drain(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def reopen(self, version: int) -> None:
        self.version = version
        self._open.set()


def stats_logger_factory(stats: BatchStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SchedulerStatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                cache = scheduler_stats.prefix_cache_stats
                stats.record(scheduler_stats.num_running_reqs, cache.hits if cache is not None else 0)

        def log_engine_initialized(self) -> None:
            pass

    return _SchedulerStatsRecorder
