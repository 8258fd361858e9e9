"""The Temporal-CLI episode start that docs/operations.md shows refuses a finished episode's id: Temporal's
default lets an ended workflow's id be used again, and a second episode under the id would take the old
token and fail late at its close (`DigestMismatchError`). The command is read from the document itself,
so the document and the behaviour cannot drift apart; it runs with the real `temporal` CLI against the
session's dev server.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import uuid
from pathlib import Path

from infra.temporal import temporal_binary
from tests.bounds import PROCESS_WAIT

REPO = Path(__file__).resolve().parents[2]


def documented_episode_start() -> str:
    """The `temporal workflow start ... --type EpisodeWorkflow ...` command of docs/operations.md."""
    text = (REPO / "docs" / "operations.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in re.split(r"\n(?=\S)", block):  # continuation lines start with spaces
            if "temporal workflow start" in command and "--type EpisodeWorkflow" in command:
                return command.replace("\\\n", " ")
    raise AssertionError("docs/operations.md shows no Temporal-CLI start of an EpisodeWorkflow")


def run(command: str, address: str, episode_id: str) -> subprocess.CompletedProcess:
    line = command.replace(".venv/bin/temporal", str(temporal_binary()))
    line = line.replace("127.0.0.1:7233", address).replace("adhoc/ep-1", episode_id)
    return subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=PROCESS_WAIT)


def test_the_documented_start_refuses_the_id_of_a_finished_episode(temporal_server):
    command = documented_episode_start()
    episode_id = f"adhoc/doc-{uuid.uuid4().hex[:8]}"
    first = run(command, temporal_server.address, episode_id)
    assert first.returncode == 0, first.stderr
    # the first episode ends (no worker needs to run it: terminated as an operator would)
    end = [str(temporal_binary()), "workflow", "terminate", "--address", temporal_server.address]
    end += ["-w", episode_id, "--reason", "test: the episode has ended"]
    ended = subprocess.run(end, capture_output=True, text=True, timeout=PROCESS_WAIT)
    assert ended.returncode == 0, ended.stderr
    again = run(command, temporal_server.address, episode_id)
    # Refused: an error, or (this server and CLI) the ended run's own id answered back, nothing started
    if again.returncode == 0:
        assert run_id(again.stdout) == run_id(first.stdout), f"a second episode ran: {again.stdout}"
    else:
        assert "already" in (again.stderr + again.stdout).lower(), again.stderr
    shown = [str(temporal_binary()), "workflow", "describe", "--address", temporal_server.address]
    described = subprocess.run(
        shown + ["-w", episode_id], capture_output=True, text=True, timeout=PROCESS_WAIT
    )
    assert run_id(described.stdout) == run_id(first.stdout), described.stdout  # the ended run, no other
    assert "CloseTime" in described.stdout, described.stdout


def run_id(output: str) -> str:
    found = re.search(r"RunId\s+(\S+)", output)
    assert found, output
    return found.group(1)
