"""The local stack that `grove infra up|down|status` manages: which services run, under which PIDs.

State is one JSON file under $GROVE_HOME/infra/ so that `down` stops exactly the processes `up`
started (by PID), and `status` can tell a stale record from a live server.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from pydantic import BaseModel

from grove.file_lock import exclusive
from grove.paths import grove_home
from infra.procs import pid_alive, stop_pid
from infra.temporal import TemporalDevServer


class ServiceRecord(BaseModel):
    name: str
    pid: int
    address: str
    ui_url: str | None = None
    log: str


class StackState(BaseModel):
    services: dict[str, ServiceRecord] = {}


def infra_dir() -> Path:
    return grove_home() / "infra"


def _state_path() -> Path:
    return infra_dir() / "stack.json"


def load_state() -> StackState:
    path = _state_path()
    return StackState.model_validate_json(path.read_text()) if path.exists() else StackState()


def save_state(state: StackState) -> None:
    infra_dir().mkdir(parents=True, exist_ok=True)
    tmp = _state_path().with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(_state_path())


def _one_at_a_time() -> AbstractContextManager[None]:
    """Serializes up/down across processes: two demos started together each found no live record, each
    started a server on the one SQLite file, and the later record overwrote the earlier. Under the lock
    the second finds the first's live record and reuses its server."""
    return exclusive(infra_dir() / "stack.lock")


def up_temporal(*, port: int = 7233, ui: bool = True, ui_port: int = 8233) -> ServiceRecord:
    """Start the dev server in the background (idempotent: a live recorded server is reused).

    Raises:
        TemporalDatabaseInUseError: an unrecorded live server has the stack's database.
    """
    with _one_at_a_time():
        return _up_temporal(port=port, ui=ui, ui_port=ui_port)


def _up_temporal(*, port: int, ui: bool, ui_port: int) -> ServiceRecord:
    state = load_state()
    rec = state.services.get("temporal")
    if rec is not None and pid_alive(rec.pid):
        return rec
    server = TemporalDevServer(infra_dir() / "temporal", port=port, ui=ui, ui_port=ui_port if ui else None)
    server.start()
    assert server.proc is not None
    rec = ServiceRecord(
        name="temporal",
        pid=server.proc.pid,
        address=server.address,
        ui_url=server.ui_url,
        log=str(server.log_path),
    )
    state.services["temporal"] = rec
    save_state(state)
    return rec


def up_s3(*, port: int = 9000) -> ServiceRecord:
    """Start a file-backed S3-compatible server (localbucket) for trying the S3 backend locally."""
    with _one_at_a_time():
        return _up_s3(port=port)


def _up_s3(*, port: int) -> ServiceRecord:
    from infra.s3server import LocalBucketServer

    state = load_state()
    rec = state.services.get("s3")
    if rec is not None and pid_alive(rec.pid):
        return rec
    server = LocalBucketServer(infra_dir() / "s3", port=port)
    server.start()
    assert server.proc is not None
    rec = ServiceRecord(name="s3", pid=server.proc.pid, address=server.endpoint, log=str(server.log_path))
    state.services["s3"] = rec
    save_state(state)
    return rec


def down() -> list[str]:
    """Stop every recorded service by its PID; returns the names stopped."""
    with _one_at_a_time():
        state = load_state()
        stopped = [name for name, rec in state.services.items() if stop_pid(rec.pid)]
        save_state(StackState())
    return stopped


def status() -> dict[str, tuple[ServiceRecord, bool]]:
    return {name: (rec, pid_alive(rec.pid)) for name, rec in load_state().services.items()}
