"""`grove worker` stops on SIGTERM while its engine loads (cli/sigterm_while_loading.py).

vLLM's engine start blocks the worker's event loop until the engine has loaded (minutes on a loaded CPU),
so the loop's SIGTERM handler could not run and a terminated worker went on loading. The test holds the
engine's model worker process in the middle of its load with the `engine_loading` gate
(activities/vllm_worker_ext.py), so the worker is blocked in vLLM's start for as long as the test
needs, checks that the engine's processes exist (vLLM's EngineCore and the held model worker), sends
SIGTERM to the worker process alone, and waits (bounded) for the worker and every engine process to exit.
A real `grove worker` process, a real vLLM engine, the session's Temporal dev server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from cli.sigterm_while_loading import EXIT_STOPPED
from grove import queues
from grove.gates import GateControl
from infra.procs import log_tail
from infra.worker_process import WorkerProcess, wait_until
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import descendants, wait_exited

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

EXIT_BOUND_S = 60.0  # a bound on exiting; the bug it guards: no exit until the engine has loaded
ENGINE_CORE = "VLLM::EngineCor"  # vLLM's EngineCore process title, as /proc/<pid>/comm cuts it


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

        async def held() -> bool:  # the gate's state, not a window: the model worker stays held
            worker.check_alive()
            return str(worker.pid) in gates.held("engine_loading")

        await wait_until(held, STATE_WAIT, "the engine's model worker held mid-load", logs=[worker.log_path])
        engine = descendants(worker.pid)
        holder = gates.holder("engine_loading", str(worker.pid))
        cores = [pid for pid, name in engine.items() if name == ENGINE_CORE]
        assert holder in engine and len(cores) == 1, engine  # the engine's processes, found mid-load
        os.kill(worker.pid, signal.SIGTERM)  # the worker process only
        try:
            code = await asyncio.to_thread(worker.proc.wait, EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker alive {EXIT_BOUND_S:g} s after SIGTERM:\n{log_tail(worker.log_path, 40)}")
        log = log_tail(worker.log_path, 40)
        assert code == EXIT_STOPPED and "worker stopped" in log, log
        assert f"its processes [{cores[0]}] stopped" in log, log  # it stopped EngineCore itself
        took = wait_exited(engine, EXIT_BOUND_S)  # every engine process went with it
        print(f"worker stopped while its engine loaded; engine processes gone after {took}")
    finally:
        gates.disarm("engine_loading")
        worker.stop()
