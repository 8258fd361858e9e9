"""One SQLite file, one dev server: a second server on a live server's database is refused before it
starts (two servers on one file undo each other's state: a demo started beside another lost its
namespace mid-run), the lock dies with the server (a SIGKILLed server's database starts again), and
`grove infra up` from two processes at once starts one server that both use."""

from __future__ import annotations

import threading

import pytest

from infra import stack
from infra.procs import free_port, pid_alive, stop_pid
from infra.temporal import TemporalDatabaseInUseError, TemporalDevServer


def test_a_second_server_on_a_live_servers_database_is_refused_before_it_starts(tmp_path):
    first, second = TemporalDevServer(tmp_path).start(), TemporalDevServer(tmp_path)
    try:
        with pytest.raises(TemporalDatabaseInUseError, match=str(first.db_path)):
            second.start()
        assert second.proc is None  # nothing was started
        assert first.healthy()  # and the live one is untouched
        first.kill()  # SIGKILL: the kernel drops the server's lock with it
        third = TemporalDevServer(tmp_path).start()
        try:
            assert third.healthy()
        finally:
            third.stop()
    finally:
        first.stop()
        second.stop()  # a no-op unless the refusal failed


def test_a_started_server_started_again_is_the_same_server_and_its_block_stops_it(tmp_path):
    server = TemporalDevServer(tmp_path)
    try:
        with server.start():  # start, then __enter__ starts it again
            pid = server.proc.pid
            assert server.start().proc.pid == pid and server.healthy()
        assert not pid_alive(pid)  # the block's end stopped the one server there was
    finally:
        server.stop()  # a no-op unless the second start refused (the first then outlived the block)


def test_two_infra_ups_at_once_start_one_server_and_both_use_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GROVE_HOME", str(tmp_path / "home"))
    gate = threading.Barrier(2)  # both calls enter up_temporal together
    records, errors = [], []

    def up(port: int) -> None:
        gate.wait()
        try:
            records.append(stack.up_temporal(port=port, ui=False))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=up, args=(free_port(),)) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(records) == 2 and records[0] == records[1]  # the second reused the first's server
        assert stack.status()["temporal"] == (records[0], True)
    finally:
        stopped = stack.down()
        for rec in records:  # nothing outlives the test, whatever failed above
            stop_pid(rec.pid)
    assert stopped == ["temporal"] and not any(pid_alive(r.pid) for r in records)


def test_infra_up_beside_an_unrecorded_server_on_its_database_says_so_and_starts_nothing(
    tmp_path, monkeypatch
):
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.setenv("GROVE_HOME", str(tmp_path / "home"))
    other = TemporalDevServer(stack.infra_dir() / "temporal").start()  # started outside `grove infra up`
    try:
        result = CliRunner().invoke(app, ["infra", "up", "--no-ui", "--port", str(free_port())])
        assert result.exit_code == 1
        assert "in use by another live dev server" in result.output and str(other.db_path) in result.output
        assert stack.status() == {}  # nothing recorded, nothing started
    finally:
        other.stop()
