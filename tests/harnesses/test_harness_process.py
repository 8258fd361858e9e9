"""The harness runner's process handling, each case (harness_process_cases.py) in a fresh interpreter.

Why a fresh interpreter: the runner supervises its harness with asyncio subprocesses, whose exit
notifications depend on process-wide state (the child watcher, signal dispositions, who reaps which
child). In the suite's shared pytest process, after the real-service tests that ran before (vLLM
engines, Temporal workers, their subprocesses and cleanups), these cases hung (a cancelled launch, a
killed worker's exit never reported) although they pass alone in seconds. A harness worker is its own
process (`grove worker --queues harness`), so each case runs in one of its own: the cases test the
runner's handling of its harness's processes, not what earlier tests left in the suite's process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bounds import PROCESS_WAIT

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("harness_process_cases.py")
NAMES = (
    "test_deadline_kills_the_whole_group_and_the_failure_names_stderr",
    "test_a_cancelled_launch_kills_its_group",
    "test_a_launch_cancelled_while_starting_kills_its_group",
    "test_a_relaunch_reaps_what_a_killed_worker_left_behind",
    "test_a_cancelled_python_harness_is_killed_with_its_group",
    "test_a_claude_code_launch_runs_the_pinned_binary_and_closes_with_its_outcome",
)


@pytest.mark.parametrize("case", NAMES)
def test_harness_process_case_in_its_own_interpreter(case: str, tmp_path: Path) -> None:
    # The inner pytest gets its own --basetemp inside this test's folder and none of the outer run's
    # PYTEST_ADDOPTS: pytest empties its --basetemp when it starts, so an inner run that inherited the
    # outer `--basetemp` (PYTEST_ADDOPTS="--basetemp=...") deleted the folders of the outer session's
    # live services (its Temporal dev server's database among them), failing every later test on them.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}",
         f"{CASES}::{case}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_WAIT,
    )  # fmt: skip
    # "1 passed" guards against a case that was renamed away (pytest exits 4/5 on no such test, but
    # a passing run must also have run exactly this case)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
