"""A rank process ends through activities/train_ranks.py `end_rank`: its exit code and its output
survive skipping interpreter finalization (the supervisor reads both)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.bounds import PROCESS_WAIT

ROOT = Path(__file__).resolve().parents[2]


def _run(body: str) -> subprocess.CompletedProcess:
    program = textwrap.dedent(
        f"""
        import sys
        from activities.train_ranks import end_rank

        def body():
            print("written before the end")  # buffered: stdout is a pipe
            print("to stderr too", file=sys.stderr)
        {textwrap.indent(textwrap.dedent(body), "    ")}

        end_rank(body)
        print("not reached")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=PROCESS_WAIT
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [("pass", 0), ("raise SystemExit(3)", 3), ("raise SystemExit(None)", 0), ("sys.exit(0)", 0)],
)
def test_the_exit_code_is_the_body_s_and_buffered_output_is_flushed(body, code):
    done = _run(body)
    assert done.returncode == code
    assert done.stdout == "written before the end\n"
    assert done.stderr == "to stderr too\n"


def test_an_exception_is_printed_with_its_traceback_and_exits_1():
    done = _run("raise ValueError('the shard is short')")
    assert done.returncode == 1
    assert done.stdout == "written before the end\n"
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().endswith("ValueError: the shard is short")


def test_a_system_exit_with_a_message_prints_it_and_exits_1():
    done = _run("raise SystemExit('rank 1: no shard')")
    assert done.returncode == 1
    assert done.stderr.endswith("rank 1: no shard\n")
