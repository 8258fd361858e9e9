"""The localbucket server wrapper: restart persistence on the same data dir, failures with the log tail."""

from __future__ import annotations

import socket

import pytest

from infra.procs import ServiceStartError, pid_alive
from infra.s3server import LocalBucketServer
from storage.base import StoreUnreachableError


def test_objects_survive_a_restart_on_the_same_data_dir(tmp_path):
    data = tmp_path / "s3data"
    server = LocalBucketServer(data).start()
    port, pid = server.port, server.proc.pid
    server.store("persist", create_bucket=True).put("rows/step-1/part-0", b"\x00row bytes\xff")
    server.stop()
    assert not pid_alive(pid)
    with pytest.raises(StoreUnreachableError):
        server.store("persist").get("rows/step-1/part-0")

    # localbucket is file-backed: the object is a plain file under DATA_DIR/BUCKET/KEY.
    assert (data / "persist" / "rows" / "step-1" / "part-0").read_bytes() == b"\x00row bytes\xff"

    with LocalBucketServer(data, port=port) as again:
        store = again.store("persist")  # no create: the bucket must still be there
        assert store.list("") == ["rows/step-1/part-0"]
        assert store.get("rows/step-1/part-0") == b"\x00row bytes\xff"
        pid = again.proc.pid
    assert not pid_alive(pid)


def test_start_failure_reports_the_server_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = LocalBucketServer(tmp_path / "s3data", port=taken.getsockname()[1])
        with pytest.raises(ServiceStartError, match=r"(?s)exited with code.*Address already in use"):
            server.start(timeout=15)
    assert server.proc is None


def test_stop_is_idempotent(tmp_path):
    server = LocalBucketServer(tmp_path / "s3data")
    server.stop()  # never started
    server.start()
    assert server.healthy()
    server.stop()
    server.stop()
    assert not server.healthy()
