"""A pool of spawned worker processes for the gateway's CPU work, replaced when a worker dies.

The gateway measures prompts (gateway/tokenization.py) and decodes large bodies (gateway/body_parse.py)
outside its event loop, each in a pool of its own processes. Both need the same mechanics: `spawn`
workers (the gateway has threads, so it is never forked), an initializer that nices the worker and loads
what it needs, and a dead worker turning the whole executor into a `BrokenProcessPool`, after which a
fresh executor must serve the next request. `run` raises that `BrokenProcessPool` once, for the caller to
answer with its own typed, retryable error; the executor is already replaced by then.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")


class WorkerPool:
    """`processes` spawned workers, each started with `initializer(*initargs)`; no process starts
    before the first `run`."""

    def __init__(self, processes: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
        self.processes = processes
        self._initializer = initializer
        self._initargs = initargs
        self._executor: ProcessPoolExecutor | None = None

    def _live(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=multiprocessing.get_context("spawn"),  # the gateway has threads: never fork it
                initializer=self._initializer,
                initargs=self._initargs,
            )
        return self._executor

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker; BrokenProcessPool when a worker died (the next run gets new ones)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._live(), fn, *args)
        except BrokenProcessPool:
            self._executor = None
            raise

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
