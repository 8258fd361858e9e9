"""Every episode setting and id is checked once, where the episode is specified (issue 41, item 3): the
same rule (EpisodeSpec, grove/ids.py) for `grove episode start`, the Python start and a Temporal client's
start, with a clear error naming the field; exit 2 from the CLI, before Temporal is asked.

Such a spec, admitted, leaves an episode every call of which fails (500 for an infinite idle timeout, 502
for a max_tokens past the engine's integers, 503 `InvalidKeyError` for an id with `..` or a newline, 500
"file name too long" for a 300-character id part), and a Temporal client's start with it would fail its
first workflow task for ever.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from grove.contracts import EpisodeSpec, EpisodeSpecError, HarnessSpec
from grove.runconfig import validate_run_config
from harnesses import scenario
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT
from workflows.episode import EpisodeWorkflow

REPO = Path(__file__).resolve().parents[2]
FAILS_WITHIN = 120.0  # seconds for a refused spec's workflow to fail (a bound: it fails in its first task)

BAD = [  # (CLI flags, the field the refusal names, words of its reason)
    (["--idle-timeout-s", "inf"], "idle_timeout_s", "less than or equal to 604800"),
    (["--idle-timeout-s", "nan"], "idle_timeout_s", "idle_timeout_s"),
    (["--idle-timeout-s", "0"], "idle_timeout_s", "greater than 0"),
    (["--max-tokens", "99999999999999999999"], "max_tokens", "less than or equal to 1048576"),
    (["--id", "../../etc/x"], "episode_id", "'..' part"),
    (["--id", "adhoc/a\nb"], "episode_id", "characters ['\\n']"),
    (["--id", "adhoc/" + "x" * 300], "episode_id", "a part of 300 characters"),
    (["--id", "adhoc//x"], "episode_id", "an empty part"),
]


@pytest.mark.parametrize(("flags", "field", "reason"), BAD, ids=[f"{f[0]}={f[1][:12]!r}" for f, _, _ in BAD])
def test_the_cli_refuses_a_bad_setting_or_id_with_exit_2_before_temporal(flags, field, reason):
    env = {**os.environ, "GROVE_GATEWAY_SECRET": "x" * 32, "PYTHONPATH": str(REPO)}
    # port 1 of loopback: nothing listens there; a start that got as far as Temporal would exit 5
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "episode",
        "start",
        "--external",
        *flags,
        "--address",
        "127.0.0.1:1",
    ]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=PROCESS_WAIT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert field in done.stderr and reason in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def spec_fields(**changes) -> dict:
    run = f"refuse-{uuid.uuid4().hex[:6]}"
    fields = {
        "run_id": run, "step": 1, "group_id": f"{run}/t0", "episode_id": f"{run}/s000001/t0/g0",
        "task": scenario.make_task(0).model_dump(mode="json"), "harness": {"kind": "external"},
    }  # fmt: skip
    return {**fields, **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"idle_timeout_s": float("inf")}, "idle_timeout_s"),
        ({"sampling": {"max_tokens": 10**20}}, "sampling.max_tokens"),
        ({"sampling": {"temperature": True}}, "temperature=True is a boolean"),
        ({"episode_id": "../../etc/x"}, "episode_id"),
        ({"group_id": "g\n1"}, "group_id"),
    ],
)
def test_the_python_start_refuses_the_same_with_one_typed_error(changes, field):
    """`grove.episode_start.start_episode` takes an EpisodeSpec: building it is where the rule holds."""
    with pytest.raises(EpisodeSpecError, match=field.replace("[", r"\[")):
        EpisodeSpec.model_validate(spec_fields(**changes))


def test_a_valid_spec_and_run_ids_of_every_shape_grove_makes_pass():
    spec = EpisodeSpec.model_validate(spec_fields(episode_id="adhoc/0a1b2c3d4e5f"))
    assert spec.harness == HarnessSpec(kind="external")
    assert validate_run_config({"run_id": "delegation-pw"}).run_id == "delegation-pw"
    with pytest.raises(ValueError, match="run_id 'a/b/c/d/e' has 5 parts"):  # its episodes add 4 more
        validate_run_config({"run_id": "a/b/c/d/e"})


@pytest.mark.timeout(SERVICE_TEST_TIMEOUT)
async def test_a_temporal_client_start_with_a_bad_spec_fails_at_once_naming_the_field(temporal_client):
    """The documented Temporal-client start (docs/operations.md) bypasses the Python models on the client;
    the workflow refuses the spec when it decodes it, and fails at once instead of retrying its first
    workflow task for ever. (The episode workflow's own worker, on a queue of its own.)"""
    queue = f"refuse-{uuid.uuid4().hex[:6]}"
    bad = spec_fields(idle_timeout_s=1e300)
    async with Worker(temporal_client, task_queue=queue, workflows=[EpisodeWorkflow]):
        handle = await temporal_client.start_workflow(
            "EpisodeWorkflow", bad, id=bad["episode_id"], task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as err:
            await asyncio.wait_for(handle.result(), FAILS_WITHIN)
    assert "idle_timeout_s" in str(err.value.cause) and "604800" in str(err.value.cause)
