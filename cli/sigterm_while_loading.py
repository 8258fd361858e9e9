"""`grove worker` stops on SIGTERM while its inference engine loads (cli/worker.py).

vLLM's engine start blocks the worker's event loop until the engine has loaded (minutes on a loaded CPU:
docs/results.md section 5), so the loop's own SIGTERM handler (cli/main.py) could run only after the
load. While the load runs, `stop_on_sigterm` handles SIGTERM itself: it kills the engine's processes
(this process's multiprocessing children: vLLM's EngineCore, whose model workers die with it,
activities/vllm_worker_ext.py), says "worker stopped" and exits with status 0, as a worker stopped by
SIGTERM after its load does. Nothing else needs stopping then: the worker polls no queue before its
engine has loaded.

Two things keep a plain handler from running: Python runs signal handlers in the main thread only, when
it executes bytecode or a C call there returns EINTR, and the kernel may hand a process's SIGTERM to any
thread (Temporal's runtime has several), which leaves the main thread in vLLM's zmq poll (up to vLLM's
ready timeout); so a forwarding thread reads the signal from the wakeup fd and sends it once to the main
thread, whose poll it interrupts. And pyzmq's poll retries on EINTR, dropping an exception that the handler
raised meanwhile; so the handler exits the process instead of raising.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

EXIT_STOPPED = 0  # as `grove worker` stopped by SIGTERM after its engine has loaded
KILL_WAIT_S = 30.0  # how long the handler waits for each killed engine process to be reaped


def stop_engine_processes() -> list[int]:
    """SIGKILL this process's multiprocessing children and reap them; returns their pids."""
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(KILL_WAIT_S)
    return [child.pid for child in children if child.pid is not None]


@contextlib.contextmanager
def stop_on_sigterm(say: Callable[[str], None]) -> Iterator[None]:
    """While this block runs, SIGTERM stops the process (module docstring). Outside the main thread
    (an in-process worker of a test or a bench) it does nothing: signals are the main thread's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        stopped = stop_engine_processes()
        say(f"worker: SIGTERM while the inference engine was loading; its processes {stopped} stopped")
        say("worker stopped")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STOPPED)

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    main = threading.main_thread().ident

    def forward() -> None:
        forwarded = False
        while data := os.read(read_fd, 64):  # b"" once the block closes the pipe
            if signal.SIGTERM in data and not forwarded and main is not None:
                forwarded = True  # once: the main thread's own delivery writes the fd again
                signal.pthread_kill(main, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    forwarder = threading.Thread(target=forward, name="grove-sigterm-forward", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous)
        os.close(write_fd)
        forwarder.join(timeout=5)
        os.close(read_fd)
