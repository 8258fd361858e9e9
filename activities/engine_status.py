"""Each inference worker reports its engine's state to the object store; runs and benches read it.

Every `REPORT_EVERY_S` the worker writes `engines/{queue}/{engine_id}.json` (grove.contracts.EngineStatus:
the run and version it serves, generations in flight, whether it is loading weights, how many calls it
admitted and for how many seconds it was busy). Nothing depends on it for correctness: it is how the
run's `progress` query (workflows/training_run.py, through the `engine_statuses` io activity), `grove
run status` and bench/bench_async.py see every engine of a queue, including ones the run never talked
to directly. A report older than `STALE_AFTER_S` belongs to an engine that stopped (or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

from temporalio import activity

from grove.contracts import EngineStatus
from grove.store_layout import engine_status_key, engine_statuses_prefix
from storage.base import ObjectNotFoundError, ObjectStore

REPORT_EVERY_S = 1.0
STALE_AFTER_S = 10.0


def engine_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def snapshot(engine, queue: str, eid: str, started: float) -> EngineStatus:
    return EngineStatus(
        engine_id=eid, queue=queue, run_id=engine.run_id, version=engine.version,
        in_flight=engine.in_flight, publishing=engine.publishing, calls=engine.calls_admitted,
        busy_s=engine.busy_seconds, up_s=time.monotonic() - started, written_at=time.time(),
    )  # fmt: skip


async def report_forever(engine, store: ObjectStore, queue: str, every: float = REPORT_EVERY_S) -> None:
    """Write the engine's status every `every` seconds until cancelled (a failed write is skipped)."""
    eid, started = engine_id(), time.monotonic()
    key = engine_status_key(queue, eid)
    while True:
        data = snapshot(engine, queue, eid, started).model_dump_json().encode()
        with contextlib.suppress(Exception):  # a status report never takes the worker down
            await asyncio.to_thread(store.put, key, data)
        await asyncio.sleep(every)


def read_statuses(store: ObjectStore, queue: str, *, live_only: bool = True) -> list[EngineStatus]:
    """The engines that report on `queue`, by id; `live_only`: only reports younger than STALE_AFTER_S."""
    now = time.time()
    out = []
    for key in sorted(store.list(engine_statuses_prefix(queue))):
        try:
            status = EngineStatus.model_validate_json(store.get(key))
        except (ObjectNotFoundError, ValueError):
            continue  # replaced while listing, or not a status report
        status.age_s = max(0.0, now - status.written_at)
        if not live_only or status.age_s <= STALE_AFTER_S:
            out.append(status)
    return out


class EngineStatusActivities:
    """The `engine_statuses` activity of the io queue (a run's progress shows its engines)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name="engine_statuses")
    def engine_statuses(self, queue: str) -> list[EngineStatus]:
        return read_statuses(self.store, queue)
