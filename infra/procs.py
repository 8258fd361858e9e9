"""Small helpers for the real services grove starts: free ports, readiness polling, PID-only stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class ServiceStartError(RuntimeError):
    """A service process exited or never became ready; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(lines[-n:])


def wait_ready(
    name: str, proc: subprocess.Popen | None, ready: Callable[[], bool], timeout: float, log: Path
) -> None:
    """Poll `ready()` until true; fail with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceStartError(
                f"{name} exited with code {proc.returncode} before it was ready. Log {log}:\n{log_tail(log)}"
            )
        if ready():
            return
        time.sleep(0.1)
    raise ServiceStartError(f"{name} not ready after {timeout:.0f} s. Log {log}:\n{log_tail(log)}")


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM `pid`, SIGKILL after `timeout`; True if a process was stopped. Only our own PIDs are passed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); reap it if it is ours
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True
