"""A pool of spawned worker processes for the gateway's CPU work, replaced when a worker dies.

The gateway measures prompts (gateway/intake/tokenization.py) and decodes large bodies
(gateway/intake/body_parse.py) outside its event loop, each in a pool of its own processes. Both need the same
mechanics: `spawn` workers (the gateway has threads, so it is never forked), an initializer that nices the
worker and loads what it needs, and a dead worker turning the whole executor into a `BrokenProcessPool`, after
which a fresh executor must serve the next request. `run` raises that `BrokenProcessPool` once, for the caller
to answer with its own typed, retryable error; the executor is already replaced by then.

A worker dies with the gateway, SIGKILL included (nothing of the gateway could clean up then): on Linux
each worker asks the kernel for SIGKILL when its parent ends (`PR_SET_PDEATHSIG`), and exits at once if
the gateway was already gone before it asked. The kernel sends the signal when the *thread* that spawned
the worker ends; workers are spawned by `ProcessPoolExecutor.submit`, called from the event loop's thread,
which lives as long as the gateway.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the gateway died before the request above took effect
        os._exit(1)


def _start(parent: int, initializer: Callable[..., None], *initargs: Any) -> None:
    die_with_parent(parent)
    initializer(*initargs)


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
                initializer=_start,
                initargs=(os.getpid(), self._initializer, *self._initargs),
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
