"""Helpers of the durability tests: grove worker subprocesses we can SIGKILL, and ways to watch Temporal.

A `WorkerProcess` is a real `grove worker --queues ...` process started in its own session, so a
SIGKILL of its process group takes down the vLLM EngineCore and model-worker children with it (a
crashed host), and nothing else: only the group we started is ever signalled, by its id.

Waiting is always bounded; a wait that runs out raises `WaitTimeoutError` naming what was awaited
and the tail of the worker logs, so a failure says where it stuck.
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
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from grove import queues
from grove.gates import GateControl
from infra.procs import log_tail
from tests.bounds import STATE_WAIT  # noqa: F401 (the kit's waits; tests import it from here too)

T = TypeVar("T")

# server answers that mean "not answered", not "no": a polled read asks again (wait_until)
TRANSIENT_RPC = frozenset(
    {RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE}
)

GROVE = Path(sys.executable).parent / "grove"


class WaitTimeoutError(AssertionError):
    """A bounded wait of a durability test ran out (the message names what it waited for)."""


class WorkerExitedError(AssertionError):
    """A worker subprocess exited while the test needed it alive."""


class WorkerProcess:
    """One `grove worker` subprocess serving `queues`, owned by the test (signalled by its group id)."""

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
        self.cwd: Path | None = None  # the process's working directory (None: the test's)

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

    async def wait_ready(self, client: Client, timeout: float = STATE_WAIT) -> None:
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


def _queue_type(name: str) -> int:
    return (
        TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
        if name == queues.EPISODES
        else TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    )


async def has_poller(client: Client, queue: str, pid: int) -> bool:
    """Whether process `pid` polls `queue` (Temporal's default worker identity is `pid@hostname`)."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=_queue_type(queue)
        )
    )
    return any(p.identity.startswith(f"{pid}@") for p in resp.pollers)


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
    answer not given yet, asked again within the same bound: a loaded dev server cancels such reads
    (a describe_task_queue of `wait_ready` failed "operation was canceled" in a loaded suite run at load
    ~20), and a test must not fail for a state read it may simply repeat."""
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


# ---------------------------------------------------------------------------------------- workflows


async def pending_activities(handle: WorkflowHandle) -> list[PendingActivityInfo]:
    desc = await handle.describe()
    return list(desc.raw_description.pending_activities)


def is_started(info: PendingActivityInfo) -> bool:
    return info.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED


async def heartbeat_details(client: Client, info: PendingActivityInfo) -> list[Any]:
    """The last recorded heartbeat details of a pending activity (decoded), [] if none yet."""
    if not info.HasField("heartbeat_details") or not info.heartbeat_details.payloads:
        return []
    return await client.data_converter.decode(info.heartbeat_details.payloads)


async def decoded_inputs(
    client: Client, handle: WorkflowHandle, activity: str, input_type: type[T]
) -> list[T]:
    """The inputs of every `activity` the workflow scheduled, in history order, as `input_type` models."""
    history = await handle.fetch_history()
    out: list[T] = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_type.name == activity:
            [value] = await client.data_converter.decode(attrs.input.payloads, [input_type])
            out.append(value)
    return out


async def _started(handle: WorkflowHandle, activity: str) -> list[Any]:
    """The started events of each scheduled `activity` (history order). The server records the started
    event of an activity's final attempt only."""
    history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    started = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == activity:
                started.append(attrs)
    return started


async def activity_attempts(handle: WorkflowHandle, activity: str) -> list[int]:
    """The attempt number each scheduled `activity` finally started with (history order)."""
    return [attrs.attempt for attrs in await _started(handle, activity)]


async def activity_identities(handle: WorkflowHandle, activity: str) -> list[str]:
    """The identity (`pid@hostname`) of the worker that ran each scheduled `activity`'s final attempt."""
    return [attrs.identity for attrs in await _started(handle, activity)]


async def workflow_ids_of_run(client: Client, run_id: str, workflow_type: str) -> list[str]:
    """Ids of every execution (any status, every run of an id) tagged GroveRun=run_id."""
    query = f"GroveRun = '{run_id}' AND WorkflowType = '{workflow_type}'"
    return [wf.id async for wf in client.list_workflows(query)]


async def activity_results(
    client: Client, handle: WorkflowHandle, activity: str, result_type: type[T]
) -> list[T]:
    """The results of every completed `activity` of the workflow, in history order."""
    history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    out: list[T] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == activity:
                [value] = await client.data_converter.decode(attrs.result.payloads, [result_type])
                out.append(value)
    return out


async def scheduled_call_ids(
    client: Client, handle: WorkflowHandle, activity_ids: Iterable[str]
) -> dict[str, str]:
    """activity id -> call id of the `generate` activities with those ids (from their scheduled inputs)."""
    from grove.contracts import GenerateInput

    wanted = set(activity_ids)
    history = await handle.fetch_history()
    out: dict[str, str] = {}
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_id in wanted:
            [inp] = await client.data_converter.decode(attrs.input.payloads, [GenerateInput])
            out[attrs.activity_id] = inp.call_id
    return out


# ---------------------------------------------------------------------------------------- the stack

MAIN_QUEUES = (queues.EPISODES, queues.IO, queues.INFERENCE)


class DurabilityStack:
    """A dev server on its own SQLite file, a local object store, and two worker processes: `main`
    (episodes, io, inference: the vLLM engine) and `trainer` (the learner), each killable on its own.

    Runs may share the engine: each run publishes its own policy version at its start, and the engine
    switches to that run's lineage (activities/engine.py).
    """

    def __init__(self, root: Path, model: Path, *, store_url: str | None = None, store_env=None) -> None:
        """`store_url`: the workers' GROVE_STORE (default a local store under root/store); `store_env`:
        more environment for them (an S3 store's credentials)."""
        from infra.temporal import TemporalDevServer

        self.root = Path(root)
        self.store_dir = self.root / "store"
        self.store_url = store_url or self.store_dir.as_uri()
        self.store_env = dict(store_env or {})
        self.server = TemporalDevServer(self.root / "temporal")
        self.model = Path(model)
        # Test gates (grove/gates.py): the workers hold at armed points until the test releases them.
        self.gates = GateControl(self.root / "gates")
        self.client: Client | None = None
        self.main: WorkerProcess | None = None
        self.trainer: WorkerProcess | None = None

    def _worker(self, name: str, queue_names: Iterable[str]) -> WorkerProcess:
        return WorkerProcess(
            name, queue_names, address=self.server.address, store_url=self.store_url, model=self.model,
            log_dir=self.root / "logs", extra_env={**self.gates.env, **self.store_env},
        )  # fmt: skip

    async def up(self) -> DurabilityStack:
        """Start (or restart after a test's kill) whatever is down, and wait until it polls."""
        from grove.client import connect

        if self.server.proc is None or self.server.proc.poll() is not None:
            self.server.start()
        if self.client is None:
            self.client = await connect(self.server.address)
        self.main = self.main or self._worker("main", MAIN_QUEUES)
        self.trainer = self.trainer or self._worker("trainer", [queues.TRAINER])
        for w in (self.main, self.trainer):
            if not w.alive():
                w.start()
        for w in (self.main, self.trainer):
            await w.wait_ready(self.client)
        return self

    def down(self) -> None:
        for w in (self.main, self.trainer):
            if w is not None:
                w.stop()
        self.server.stop()

    def logs(self) -> list[Path]:
        return [w.log_path for w in (self.main, self.trainer) if w is not None] + [self.server.log_path]


# ---------------------------------------------------------------------------------------- gates


async def wait_held(
    stack: DurabilityStack, point: str, count: int, what: str, timeout: float = STATE_WAIT
) -> list[str]:
    """Until `count` keys are held at gate `point`. Held is a state, not a window: a held process stays
    at the point until the test releases it, so this wait cannot miss it."""

    async def held() -> list[str] | None:
        for w in (stack.main, stack.trainer):
            if w is not None:
                w.check_alive()
        keys = stack.gates.held(point)
        return keys if len(keys) >= count else None

    return await wait_until(held, timeout, what, logs=stack.logs())


# ---------------------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc/<pid>/task/*/children."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` -> its name (/proc/<pid>/comm), depth first."""
    found: dict[int, str] = {}
    for child in children(pid):
        with contextlib.suppress(FileNotFoundError):
            found[child] = Path(f"/proc/{child}/comm").read_text().strip()
            found.update(descendants(child))
    return found


def wait_exited(pids: Iterable[int], timeout: float) -> dict[int, float]:
    """Block until every pid has exited (pidfd: no polling); pid -> seconds it took. Processes that are
    not our children cannot be waited on with waitpid, but a pidfd becomes readable when they exit."""
    import select

    start = time.monotonic()
    fds: dict[int, int] = {}
    took: dict[int, float] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            took[pid] = 0.0
    try:
        while fds:
            left = timeout - (time.monotonic() - start)
            ready = select.select(list(fds), [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise WorkerExitedError(
                    f"processes {sorted(fds.values())} still alive {timeout:.0f} s after their owner died"
                )
            for fd in ready:
                took[fds.pop(fd)] = time.monotonic() - start
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return took
