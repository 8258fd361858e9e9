"""The harness runner's heartbeat does not wait on a ledger query that does not answer.

The heartbeat carries the episode's progress (calls so far, last request) from its `progress` query. A
query the episode's workflow worker does not answer (a busy or unreachable worker) must not hold the
heartbeat (Temporal would time the launch out). The test holds the query at gate `heartbeat_query`
(grove/gates.py) for as long as it needs, instead of hoping a real query is slow; the real activity
context (temporalio's ActivityEnvironment) records the heartbeats. No services, no harness process.
"""

from __future__ import annotations

import asyncio

from temporalio.testing import ActivityEnvironment

from activities.harness import HarnessRunner, RunnerConfig, _Launch, opencode_plan
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from tests.bounds import STATE_WAIT


async def test_a_query_that_does_not_answer_leaves_the_heartbeat_beating_with_the_last_details(
    tmp_path, monkeypatch
):
    gates = GateControl(tmp_path / "gates")
    gates.arm("heartbeat_query", "^ep/1$")
    monkeypatch.setenv(GATES_ENV, str(gates.root))
    runner = HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, tmp_path / "root"))
    run = _Launch(opencode_plan(tmp_path / "opencode", "hello", tmp_path), tmp_path, tmp_path)
    run.calls, run.last_request = 3, "2026-12-01T23:00:00+00:00"  # what the previous beat's queries said
    beats: asyncio.Queue = asyncio.Queue()
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.put_nowait(details[0])
    task = asyncio.create_task(env.run(runner._heartbeats, run, "ep/1", 2))
    try:
        for _ in range(2):  # two beats, each after a query held at the gate and dropped
            beat = await asyncio.wait_for(beats.get(), timeout=STATE_WAIT)
            assert (beat.launch, beat.calls, beat.last_request) == (2, 3, "2026-12-01T23:00:00+00:00")
        assert gates.held("heartbeat_query") == ["ep/1"]  # the queries really reached the gate
        assert not (gates.root / "released").exists()  # ... and none was let go
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gates.disarm("heartbeat_query")
