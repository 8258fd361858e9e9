"""A worker and its vLLM engine live and die together (docs/reliability.md).

- SIGTERM of the worker process alone: the worker shuts its engine down and exits cleanly (code 0), its
  EngineCore already gone when it exits; the model worker follows (a model worker left to its own
  watch can spin on inside an OpenMP region).
- SIGKILL of the worker process alone (not its process group: a crash of the one process, as an OOM
  kill or a `kill -9 <pid>` does it) takes its engine processes down: vLLM's EngineCore and its model
  worker (`VLLM::Worker`) exit within seconds instead of living on as orphans.
- A dead engine behind a live worker: SIGKILL of the worker's EngineCore makes the worker exit with
  EngineDiedError (so Temporal gives its calls to a live worker) instead of answering every call with
  an error; its model worker goes with it.

The engine processes are found in /proc (the worker's descendants) and their exit is awaited on pidfds:
no polling, a bounded wait.
"""

from __future__ import annotations

import os
import select
import signal
import time

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from infra.procs import log_tail
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.durability.helpers import descendants, wait_exited
from workflows.episode_failures import is_lost_attempt

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

# A bound on exiting, not a speed check: the processes exit within seconds even on a loaded machine;
# the bug it guards is a process that never exits (still running 30 s and more after its owner died).
EXIT_BOUND_S = 120.0


def engine_processes(worker_pid: int) -> dict[int, str]:
    found = descendants(worker_pid)
    names = sorted(found.values())
    assert any("EngineCor" in n for n in names), (
        f"no EngineCore below {worker_pid}: {found}"
    )  # comm: 15 chars
    assert any("Worker" in n for n in names), f"no vLLM model worker below {worker_pid}: {found}"
    return found


async def test_sigkill_of_a_worker_takes_its_engine_processes_down(stack):
    await stack.up()
    worker = stack.main
    pid = worker.pid
    engine = engine_processes(pid)

    os.kill(pid, signal.SIGKILL)  # this process only: its children get no signal from us
    assert worker.proc.wait(timeout=30) == -signal.SIGKILL
    took = wait_exited(engine, EXIT_BOUND_S)
    print(
        "engine processes gone after the worker's SIGKILL:",
        {engine[p]: f"{s:.2f} s" for p, s in took.items()},
    )
    worker.kill()  # reap and forget the process (its group is already empty)


def gone(pid: int) -> bool:
    """Whether `pid` has exited at this moment (reaped, or a zombie): a pidfd that is readable at once."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_sigterm_of_a_worker_stops_its_engine_processes(stack):
    """A plain `kill <pid>` of the worker: it shuts its engine down and exits; nothing keeps running.

    The worker itself stops the engine: it exits with code 0 ("worker stopped", not killed by the
    signal), and its EngineCore has already exited when it does (stopped by the worker, not left to
    notice its owner's death). A worker that only died of SIGTERM would leave its engine processes to
    find out by themselves, which the SIGKILL test above covers."""
    await stack.up()
    worker = stack.main
    pid = worker.pid
    engine = engine_processes(pid)
    [core] = [p for p, name in engine.items() if "EngineCor" in name]

    os.kill(pid, signal.SIGTERM)
    sent = time.monotonic()
    code = worker.proc.wait(timeout=EXIT_BOUND_S)
    exit_s = time.monotonic() - sent
    core_gone = gone(core)  # at the moment the worker's exit is seen, before any wait of ours
    log = log_tail(worker.log_path, 80)
    assert code == 0, f"the worker did not stop by itself on SIGTERM (exit code {code}):\n{log}"
    assert "worker stopped" in log, log
    assert core_gone, f"EngineCore {core} outlived the worker that owns it: not shut down by it\n{log}"
    took = wait_exited(engine, EXIT_BOUND_S)
    print(f"worker exited with code {code} {exit_s:.2f} s after SIGTERM; engine processes gone after:", took)
    worker.kill()


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_a_dead_engine_takes_its_worker_down(stack):
    await stack.up()
    worker = stack.main
    pid = worker.pid
    engine = engine_processes(pid)
    [core] = [p for p, name in engine.items() if "EngineCor" in name]

    os.kill(core, signal.SIGKILL)  # the engine dies; nobody signals the worker
    killed = time.monotonic()
    code = worker.proc.wait(timeout=EXIT_BOUND_S)
    exit_s = time.monotonic() - killed
    log = log_tail(worker.log_path, 80)
    assert code != 0, log
    assert "EngineDiedError" in log, log
    took = wait_exited(engine, EXIT_BOUND_S)
    print(f"worker exited with code {code} {exit_s:.2f} s after its EngineCore's SIGKILL; engine: {took}")
    worker.kill()


def _activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError(
        "activity failed", scheduled_event_id=5, started_event_id=6, identity="1@host",
        activity_type="generate", activity_id="7", retry_state=RetryState.MAXIMUM_ATTEMPTS_REACHED,
    )  # fmt: skip
    err.__cause__ = cause
    return err


def test_an_engine_death_is_a_lost_attempt_and_other_failures_are_not():
    """The episode re-runs a call whose engine died (on a live worker) like one whose worker vanished,
    and still fails a call that failed for what it is (bad prompt, NaN weights)."""
    died = ApplicationError("engine died", type="EngineDiedError")
    assert is_lost_attempt(_activity_error(died))
    for kind in ("NonFiniteLogprobError", "PromptTooLongError", "GenerationAbortedError"):
        assert not is_lost_attempt(_activity_error(ApplicationError("x", type=kind)))
