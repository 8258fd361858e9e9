"""Each vLLM-CPU engine binds its OpenMP threads to cores no other engine of the host binds
(activities/cpu_binding.py): claims are real `flock`s on lock files in a folder of the test's own (so the
engines other sessions run on this machine do not count), released when the engine shuts down or its
process dies. The e2e test starts two real engines in this process, and reads the CPU affinity the kernel
gives their engine processes' threads (/proc/<pid>/task/*/status): vLLM's default bound both engines'
threads to core 0 alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.cpu_binding import BIND_ENV, CLAIMS_ENV, bound_env, claim_cores

HOLDER = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); " \
    "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"  # fmt: skip


@pytest.fixture(autouse=True)
def no_operator_binding(monkeypatch):
    monkeypatch.delenv(BIND_ENV, raising=False)


def test_engines_share_out_the_free_cores_and_the_last_one_binds_nothing(tmp_path: Path):
    first = claim_cores({0, 1}, tmp_path)
    assert (first.env, first.cores) == ("0", [0])
    second = claim_cores({0, 1}, tmp_path)
    assert (second.env, second.cores) == ("nobind", []) and "held by other engines" in second.reason
    first.release()
    third = claim_cores({0, 1}, tmp_path)
    assert third.cores == [0]  # a released claim is free again
    third.release()
    many = [claim_cores(set(range(16)), tmp_path) for _ in range(5)]
    assert [b.cores for b in many] == [
        list(range(8)), list(range(8, 12)), [12, 13], [14], []
    ]  # fmt: skip
    assert not set().union(*(set(b.cores) for b in many)) & {15}  # one core always stays free


def test_a_claim_dies_with_its_process(tmp_path: Path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "core-0.lock")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"  # the gate: its flock is taken
        assert claim_cores({0, 1, 2}, tmp_path).cores == [1]  # half of the free {1, 2}
        holder.kill()
        holder.wait()
        assert claim_cores({0}, tmp_path).env == "nobind"  # one free core: nothing to bind to
    finally:
        holder.kill()


def test_the_operators_binding_is_kept_and_the_env_is_restored(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(BIND_ENV, "auto")
    kept = claim_cores({0, 1}, tmp_path)
    assert (kept.env, kept.cores) == ("auto", []) and "operator" in kept.reason
    monkeypatch.delenv(BIND_ENV)
    chosen = claim_cores({0, 1}, tmp_path)
    with bound_env(chosen):
        assert os.environ[BIND_ENV] == "0"
    assert BIND_ENV not in os.environ  # the next engine of this process chooses afresh


def _children(pid: int) -> list[int]:
    return [
        int(c)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for c in (task / "children").read_text().split()
    ]


def _pinned_cores(pid: int) -> set[str]:
    """The single cores that threads of `pid` or of its descendants are pinned to (Cpus_allowed_list of
    one core; an unbound thread's list names them all)."""
    out: set[str] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list") and line.split()[1].isdigit():
                out.add(line.split()[1])
    for child in _children(pid):
        out |= _pinned_cores(child)
    return out


@pytest.mark.slow
async def test_two_real_engines_never_bind_to_the_same_core(tiny_trained_model_dir, tmp_path, monkeypatch):
    from activities.engine import PolicyEngine
    from activities.engine_config import EngineConfig

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: there is nothing to share out")
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path / "claims"))
    config = EngineConfig(model_dir=tiny_trained_model_dir, max_model_len=256, kv_cache_bytes=32 * 2**20)
    engines = []
    # other tests' engines of this session are children too: only the two started here count
    before = set(_children(os.getpid()))
    try:
        for _ in range(2):
            engines.append(await PolicyEngine.start(config))
        # each engine's processes (new children of this one): no core is pinned by both
        pinned = [_pinned_cores(child) for child in _children(os.getpid()) if child not in before]
        assert sum(len(p) for p in pinned) == len(set().union(*pinned)), pinned
        assert any(pinned)  # the first engine's threads are bound (to its claimed core)
        bound = [set(e.cpu_binding.cores) for e in engines]
        assert bound[0] and not bound[0] & bound[1], [e.cpu_binding.describe() for e in engines]
    finally:
        for e in engines:
            await e.shutdown()
