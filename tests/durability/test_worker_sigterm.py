"""`grove worker` stops on SIGTERM while its engine loads (cli/worker.py `terminable_while_blocked`).

vLLM's engine start blocks the worker's event loop until the engine has loaded (minutes on a loaded CPU),
so the loop's SIGTERM handler could not run and a terminated worker went on loading. The test holds the
engine's model worker process in the middle of its load with the `engine_loading` gate
(activities/vllm_worker_ext.py), so the worker is blocked in vLLM's start for as long as the test
needs, sends SIGTERM to the worker process alone, and waits (bounded) for the worker and its engine
processes to exit. A real `grove worker` process, a real vLLM engine, the session's Temporal dev server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from grove import queues
from grove.gates import GateControl
from infra.procs import log_tail
from infra.worker_process import WorkerProcess
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import descendants, wait_exited

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

EXIT_BOUND_S = 60.0  # a bound on exiting; the bug it guards: no exit until the engine has loaded


async def test_sigterm_stops_a_worker_whose_engine_is_loading(temporal_server, tiny_model_dir, tmp_path):
    gates = GateControl(tmp_path / "gates")
    gates.arm("engine_loading", ".*")
    store = (tmp_path / "store").as_uri()
    worker = WorkerProcess(
        "loading", [queues.INFERENCE], address=temporal_server.address, store_url=store,
        model=tiny_model_dir, log_dir=tmp_path / "logs", extra_env=gates.env,
    )  # fmt: skip
    worker.start()
    try:
        deadline = time.monotonic() + STATE_WAIT
        while str(worker.pid) not in gates.held("engine_loading"):  # the gate's state, not a window
            worker.check_alive()
            assert time.monotonic() < deadline, log_tail(worker.log_path, 40)
            await asyncio.sleep(0.2)
        engine = descendants(worker.pid)
        assert gates.holder("engine_loading", str(worker.pid)) in engine  # held inside the engine's load
        os.kill(worker.pid, signal.SIGTERM)  # the worker process only
        code = await asyncio.to_thread(worker.proc.wait, EXIT_BOUND_S)
        log = log_tail(worker.log_path, 40)
        assert code == 0 and "worker stopped" in log, log
        took = wait_exited(engine, EXIT_BOUND_S)  # its engine processes go with it
        print(f"worker stopped while its engine loaded; engine processes gone after {took}")
    finally:
        gates.disarm("engine_loading")
        worker.stop()
