"""A `grove worker --queues ...` subprocess that its owner can start, stop, SIGKILL, and wait on until it
polls its queues: what the benchmarks (bench/bench_async.py) and the durability tests run workers as.

The worker runs in its own session, so its process group id is its pid: a SIGKILL of the group takes down
the vLLM EngineCore and model-worker children with it (a crashed host), and nothing else: only the group
this object started is ever signalled, by its id.

Waiting is always bounded; a wait that runs out raises `WaitTimeoutError` naming what was awaited and the
tail of the worker logs, so a failure says where it stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from grove.queue_readiness import queue_state
from infra.procs import log_tail

T = TypeVar("T")

# server answers that mean "not answered", not "no": a polled read asks again (wait_until)
TRANSIENT_RPC = frozenset(
    {RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE}
)
# A worker polls an inference queue only once its vLLM engine is loaded: minutes on a loaded machine.
READY_WAIT_S = 900.0

GROVE = Path(sys.executable).parent / "grove"


class WaitTimeoutError(TimeoutError):
    """A bounded wait ran out (the message names what it waited for and the logs' tails)."""


class WorkerExitedError(RuntimeError):
    """A worker subprocess exited while its owner needed it alive (or its processes outlived a kill)."""


class WorkerProcess:
    """One `grove worker` subprocess serving `queues`, owned by its creator (signalled by its group id)."""

    def __init__(
        self,
        name: str,
        queue_names: Iterable[str],
        *,
        address: str,
        store_url: str,
        model: Path,
        log_dir: Path,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.extra_env = dict(extra_env or {})
        self.queues = list(queue_names)
        self.address = address
        self.store_url = store_url
        self.model = Path(model)
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.ready_seconds: float | None = None  # start -> polling every queue, of the latest start
        self.cwd: Path | None = None  # the process's working directory (None: the caller's)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"worker-{self.name}-{self.starts}.log"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise WorkerExitedError(f"worker {self.name!r} is not started")
        return self.proc.pid

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            GROVE_TEMPORAL_ADDRESS=self.address,
            GROVE_STORE=self.store_url,
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )

    def command(self) -> list[str]:
        queue_names = ",".join(self.queues)
        return [str(GROVE), "worker", "--queues", queue_names, "--model", str(self.model), "--device", "cpu"]

    def start(self) -> WorkerProcess:
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            # own session: the process group id is the worker's pid, so killpg reaches vLLM's children too
            self.proc = subprocess.Popen(
                self.command(), env=self.env(), cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and every process it started (a crash, not a shutdown)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        _wait_group_gone(pgid, self.name)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL whatever is left after `timeout`."""
        if self.proc is None:
            return
        _signal_group(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group (vLLM children)
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        self.proc = None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise WorkerExitedError(
                f"worker {self.name!r} (pid {self.proc.pid}) exited with code {self.proc.returncode}. "
                f"Log {self.log_path}:\n{log_tail(self.log_path, 40)}"
            )

    async def wait_ready(self, client: Client, timeout: float = READY_WAIT_S) -> None:
        """Until every queue of this worker has a poller whose identity is this process (pid@host)."""
        started = time.monotonic()

        async def polling() -> bool:
            self.check_alive()
            return all([await has_poller(client, q, self.pid) for q in self.queues])

        await wait_until(
            polling, timeout, f"worker {self.name!r} polling {self.queues}", logs=[self.log_path]
        )
        self.ready_seconds = time.monotonic() - started


def _wait_group_gone(pgid: int, name: str, timeout: float = 15.0) -> None:
    """Until no process of group `pgid` is left (vLLM's EngineCore and model worker die with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise WorkerExitedError(
        f"worker {name!r}: processes of group {pgid} still alive {timeout:.0f} s after SIGKILL"
    )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


async def has_poller(client: Client, queue: str, pid: int) -> bool:
    """Whether process `pid` polls `queue` (Temporal's default worker identity is `pid@hostname`)."""
    state = await queue_state(client, queue)
    return any(worker.startswith(f"{pid}@") for worker in state.workers)


async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    logs: Iterable[Path] = (),
) -> T:
    """Poll `predicate` until it returns a truthy value (returned); WaitTimeoutError after `timeout` s.

    A read of the server's state that the server drops (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE) is an
    answer not given yet, asked again within the same bound: a loaded dev server cancels such reads, and a
    wait must not fail for a state read it may simply repeat."""
    deadline = time.monotonic() + timeout
    dropped: RPCError | None = None
    while True:
        try:
            value = await predicate()
        except RPCError as err:
            if err.status not in TRANSIENT_RPC:
                raise
            value, dropped = None, err
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{log_tail(p, 25)}" for p in logs)
            last = f" (last read dropped by the server: {dropped.status.name} {dropped})" if dropped else ""
            raise WaitTimeoutError(f"waited {timeout:.0f} s for {what}; it did not happen{last}.\n{tails}")
        await asyncio.sleep(every)
