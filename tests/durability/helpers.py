"""Helpers of the durability tests: a stack of killable grove worker subprocesses (infra/worker_process.py)
on a dev server of its own, and ways to watch Temporal.

Waiting is always bounded (infra/worker_process.py `wait_until`); a wait that runs out names what was
awaited and the tail of the worker logs, so a failure says where it stuck.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowHandle

from grove import queues
from grove.gates import GateControl
from infra.worker_process import WorkerExitedError, WorkerProcess, wait_until
from tests.bounds import STATE_WAIT  # noqa: F401 (the kit's waits; tests import it from here too)

T = TypeVar("T")


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
            await w.wait_ready(self.client, STATE_WAIT)
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
