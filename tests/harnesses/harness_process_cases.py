"""The runner's process handling (activities/harness.py) with a stand-in harness executable: a real
process group, real signals, the real activity context (temporalio's ActivityEnvironment records the
heartbeats). No services: the harness here is a shell script, not OpenCode, or a Python program that hangs;
one case runs the pinned stock Claude Code against a scripted Messages server standing in for the gateway.

Run by test_harness_process.py, each case in a fresh interpreter (see there why)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.harness import (
    HarnessRunner,
    RunnerConfig,
    _Launch,
    episode_folder,
    opencode_plan,
    python_plan,
)
from grove.contracts import EpisodeSpec, HarnessRunInput, HarnessSpec, TaskSpec
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from grove.sampling import SamplingConfig
from harnesses.python_harness import python_job
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SCRIPT = """\
#!/bin/sh
# stand-in harness: one JSON event, a stderr line, a grandchild in its process group, then it hangs
echo '{"type":"text","sessionID":"ses_a","part":{"messageID":"m1","text":"partial answer"}}'
echo "boom: the model said something odd" >&2
sleep 1000 &
echo $! > "$HOME/grandchild.pid"
sleep 1000
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (its parent, the killed script, is gone; init reaps it)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def _wait_until(condition, what: str, timeout: float = STATE_WAIT) -> None:
    """Until `condition()` holds (a state that stays once reached); bounded."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        await asyncio.sleep(0.05)


async def _wait_written(path: Path, timeout: float = 60.0) -> None:
    """Until `path` holds something (a state that stays once reached); bounded."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} was never written"
        await asyncio.sleep(0.05)


def _stand_in_launch(tmp_path: Path) -> tuple[HarnessRunner, _Launch, Path]:
    """A runner (its gates read from the environment now) and a launch of the stand-in harness script in
    folders of its own; returns them and the launch's HOME (where the script writes grandchild.pid)."""
    binary = tmp_path / "harness.sh"
    binary.write_text(textwrap.dedent(SCRIPT))
    binary.chmod(0o755)
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    (home / "tmp").mkdir(parents=True)
    runner = HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, tmp_path / "root"))
    return runner, _Launch(opencode_plan(binary, "hello", home), project, home), home


async def test_deadline_kills_the_whole_group_and_the_failure_names_stderr(tmp_path):
    runner, run, home = _stand_in_launch(tmp_path)
    beats = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0])
    started = time.monotonic()
    exit_code = await env.run(runner._supervise, run, "ep/1", 1, 2.0)
    assert exit_code is None and time.monotonic() - started < 20  # the deadline, not the script, ended it
    grandchild = int((home / "grandchild.pid").read_text())
    assert await _wait_gone(grandchild), "a process of the harness's group outlived the kill"
    assert await _wait_gone(run.pid)
    close = runner._close_request(run, exit_code, 2.0)
    assert close.failure.startswith("HarnessDeadline")
    assert "boom: the model said something odd" in close.failure  # the last stderr lines
    assert close.final_answer == "partial answer"
    assert beats and beats[0].pid == run.pid and beats[0].launch == 1
    assert (home / "events.jsonl").read_text().startswith('{"type":"text"')


async def test_a_cancelled_launch_kills_its_group(tmp_path):
    runner, run, home = _stand_in_launch(tmp_path)
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(runner._supervise, run, "ep/1", 1, 600.0))
    await _wait_written(home / "grandchild.pid")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    grandchild = int((home / "grandchild.pid").read_text())
    assert await _wait_gone(grandchild) and await _wait_gone(run.pid)


async def test_a_launch_cancelled_while_starting_kills_its_group(tmp_path, monkeypatch):
    """The cancellation lands after the harness was spawned (it already started a grandchild) and before
    its start finished (gate `harness_starting`): the runner still kills the whole group and finishes
    cancelling. (Before, the cancellation skipped the kill: the group outlived the activity; and inside
    asyncio's own spawn it hung the activity on pipes the grandchild held open.)"""
    gates = GateControl(tmp_path / "gates")
    gates.arm("harness_starting", "^ep/1$")
    monkeypatch.setenv(GATES_ENV, str(gates.root))
    runner, run, home = _stand_in_launch(tmp_path)
    task = asyncio.create_task(ActivityEnvironment().run(runner._supervise, run, "ep/1", 1, 600.0))
    await _wait_until(lambda: gates.held("harness_starting") == ["ep/1"], "the start to reach its gate")
    await _wait_written(home / "grandchild.pid")
    task.cancel()  # delivered at the task's next step, before the start can see the release below
    gates.disarm("harness_starting")
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=STATE_WAIT)
    grandchild = int((home / "grandchild.pid").read_text())
    assert await _wait_gone(grandchild), "the harness's group outlived the cancelled launch"
    assert await _wait_gone(run.pid)


async def test_a_relaunch_reaps_what_a_killed_worker_left_behind(tmp_path):
    """A worker SIGKILLed mid-launch: its harness dies with it (PR_SET_PDEATHSIG) but the harness's own
    children are orphaned; the next launch of the episode on this machine kills them first."""
    binary = tmp_path / "harness.sh"
    binary.write_text(textwrap.dedent(SCRIPT))
    binary.chmod(0o755)
    root = tmp_path / "root"
    worker = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from pathlib import Path
        from activities.harness import HarnessRunner, RunnerConfig, _Launch, episode_folder, opencode_plan
        async def main():
            runner = HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, Path({str(root)!r})))
            project, home = runner._prepare("ep/1")
            run = _Launch(opencode_plan(Path({str(binary)!r}), "hello", home), project, home)
            await run.start()
            print(run.pid, flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", worker, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    harness_pid = int((await asyncio.wait_for(proc.stdout.readline(), 120)).decode())
    folder = episode_folder(root, "ep/1")
    pidfile = folder / "home" / "grandchild.pid"
    await _wait_written(pidfile)
    grandchild = int(pidfile.read_text())
    proc.kill()  # the worker dies at once (SIGKILL)
    await proc.wait()
    assert await _wait_gone(harness_pid)  # PR_SET_PDEATHSIG: the harness died with its worker
    assert _alive(grandchild)  # ... but what it started did not
    HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, root))._prepare("ep/1")  # the relaunch
    assert await _wait_gone(grandchild)


async def test_a_cancelled_python_harness_is_killed_with_its_group(tmp_path):
    """The `python` kind runs under the same supervision: its program (here one that starts a grandchild
    and never returns) is killed with its whole group; a launch that did not finish reports no result."""
    runner = HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, tmp_path / "root"))
    project, home = runner._prepare("ep/py")
    base = "http://127.0.0.1:9/episodes/ZXAvcHk/v1"
    job = python_job("tests.harnesses.python_programs:hangs", TaskSpec(family="f", task_id="t"), {}, "grove")
    run = _Launch(
        python_plan("tests.harnesses.python_programs:hangs", job, home, base, "tok", 1), project, home
    )
    env = ActivityEnvironment()
    beats = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    task = asyncio.create_task(env.run(runner._supervise, run, "ep/py", 1, 600.0))
    await _wait_written(home / "grandchild.pid")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    grandchild = int((home / "grandchild.pid").read_text())
    assert await _wait_gone(grandchild) and await _wait_gone(run.pid)
    assert [e["type"] for e in run.events] == ["grove.started"] and run.last_event == "grove.started"
    assert beats and beats[0].pid == run.pid
    close = runner._close_request(run, None, 600.0)
    assert close.failure.startswith(
        "HarnessDeadline: Python harness tests.harnesses.python_programs:hangs ran past its deadline"
    )


async def test_a_claude_code_launch_runs_the_pinned_binary_and_closes_with_its_outcome(tmp_path):
    """The `claude-code` kind end to end through the runner's activity, with the scripted Messages server
    of tests/harnesses/messages_script.py in the gateway's place (the gateway's Messages route is not
    needed to check the runner): the pinned stock binary reaches `<gateway>/episodes/<ref>/v1/messages`
    with the episode's token and launch number, its lead starts two workers, and the close carries the
    final answer and each worker's report under its name. A second attempt is launch 2."""
    from activities.harness import episode_folder
    from gateway.http.auth import issue_token
    from gateway.http.episode_ref import episode_ref
    from harnesses.claude_code_delegation import make_task
    from tests.harnesses.messages_script import scripted_messages
    from tests.harnesses.test_claude_code_binary import WORDS, answer

    task = make_task(0).model_copy(update={"params": {"words": WORDS}})
    spec = EpisodeSpec(
        run_id="cc", step=1, group_id="cc/s000001/t0", episode_id="cc/s000001/t0/g0", task=task,
        harness=HarnessSpec(kind="claude-code"), sampling=SamplingConfig(max_tokens=64),
    )  # fmt: skip
    ref, token = episode_ref(spec.episode_id), issue_token("s" * 32, spec.episode_id)
    for attempt in (1, 2):
        with scripted_messages(answer) as server:
            runner = HarnessRunner(RunnerConfig(server.url, "s" * 32, tmp_path / "root", keep_dirs=True))
            env = ActivityEnvironment()
            env.info = dataclasses.replace(env.info, attempt=attempt)
            result = await env.run(runner.run_harness, HarnessRunInput(spec=spec))
            requests = list(server.requests)
        assert result.exit_code == 0 and result.failure is None and result.launch == attempt
        *calls, close = requests
        assert {r.path for r in calls} == {f"/episodes/{ref}/v1/messages?beta=true"} and len(calls) == 4
        assert {r.headers["authorization"] for r in requests} == {f"Bearer {token}"}
        assert {r.headers["x-grove-launch"] for r in calls} == {str(attempt)}
        assert all(r.body["max_tokens"] == 64 for r in calls)
        assert {r.headers["x-stainless-timeout"] for r in calls} == {"900"}  # the launch's deadline_s
        assert close.path == f"/episodes/{ref}/close"
        assert close.body["final_answer"] == " ".join(WORDS) and close.body["failure"] is None
        assert close.body["outputs"] == {
            "parent": [" ".join(WORDS)],
            "worker": [WORDS[0]],
            "worker-2": [WORDS[1]],
        }
    folder = episode_folder(tmp_path / "root", spec.episode_id)
    assert (folder / "home" / "events.jsonl").read_text().count('"type":"result"') == 1
    assert (folder / "home" / ".claude" / ".claude.json").exists()  # its config: the launch's own folder
