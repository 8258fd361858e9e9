"""Every program in examples/ runs as shipped, in a process of its own, against real services (the real
gateway, the Temporal dev server, a grove worker with a real vLLM engine), on an episode started the way
its docstring says, and prints what it did: the episode, its accounting, its rows, its agents. The
printed figures are checked against Temporal's result and the published rows, not against themselves.
(The run configs, examples/*.yaml, are validated by tests/runs/test_runconfig.py.)

New example programs are picked up by the glob: each must run with only $GROVE_BASE_URL,
$GROVE_API_KEY and $GROVE_TEMPORAL_ADDRESS set.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grove.contracts import EpisodeResult
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import gateway_url, start_episode  # noqa: F401  (gateway_url: a fixture)
from tests.harnesses.framework_kit import bind, published_rows

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((REPO / "examples").glob("*.py"))
# each program's root agent: the Agents SDK's keeps its SDK name ("Lead agent"), LangGraph's is `parent`
ROOTS = {"agents_sdk_temporal": "Lead-agent", "langgraph_supervisor": "parent"}


def test_the_examples_folder_has_programs():
    assert [p.name for p in PROGRAMS] == ["agents_sdk_temporal.py", "langgraph_supervisor.py"]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.stem)
async def test_an_example_program_runs_as_shipped_and_reports_the_episode(
    program: Path,
    gateway_url,  # noqa: F811
    temporal_server,
    temporal_client,
    e2e_store,
):
    eid = await start_episode(temporal_client, f"example-{program.stem}")
    episode = bind(gateway_url, eid)
    env = {
        **os.environ,
        "GROVE_BASE_URL": episode.base_url,
        "GROVE_API_KEY": episode.api_key,
        "GROVE_TEMPORAL_ADDRESS": temporal_server.address,
        "PYTHONPATH": str(REPO),  # this checkout's grove, whatever the venv's editable install points at
    }
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(program)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=PROCESS_WAIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    keys = ("answer", "episode", "failure", "calls", "rows", "agents")
    printed = {
        k: v.strip() for k, _, v in (line.partition(" ") for line in done.stdout.splitlines()) if k in keys
    }

    result = await temporal_client.get_workflow_handle(eid, result_type=EpisodeResult).result()
    assert result.status == "ok", result.failure
    assert printed["episode"].split()[:2] == [eid, "ok"]
    counts = ", ".join(f"{state} {n}" for state, n in result.counts.items())
    assert printed["calls"].startswith(counts) and result.counts.get("selected", 0) >= 2
    rows = published_rows(e2e_store, result.rows_key)
    assert printed["rows"].startswith(f"{len(rows)} rows, {sum(r.num_loss_tokens for r in rows)} tokens")
    root = ROOTS[program.stem]
    assert f"{root} (last call {root}.0.c" in printed["agents"]  # the lead's calls were named
    assert printed["answer"].startswith("'") or printed["answer"].startswith('"')

    # `grove episode show` of the closed episode: its result and each row, read from the store
    show = [sys.executable, "-m", "cli.main", "episode", "show", eid, "--address", temporal_server.address]
    shown = await asyncio.to_thread(
        subprocess.run, show, cwd=REPO, env={**env, "GROVE_STORE": str(e2e_store.root)}, capture_output=True,
        text=True, timeout=PROCESS_WAIT,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    assert lines[0].split()[1:3] == [eid, "ok"] and lines[-1] == f"rows      {len(rows)} at {result.rows_key}"
    assert sorted(line.split()[1] for line in lines if line.startswith("row ")) == sorted(
        r.row_id for r in rows
    )
