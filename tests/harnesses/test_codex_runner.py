"""The harness runner on real services with stock Codex CLI (npm @openai/codex, pinned): `run_harness`
launches `codex exec` per episode with the config harnesses/codex.py writes, Codex talks to the real
gateway's Responses API, Temporal dev server and vLLM on the tiny model (2,048 positions: Codex runs
without subagents and shell tools, so that its first request fits).

What the engine served is read from the engine itself (RecordingEngine), never from grove's records.
"""

from __future__ import annotations

import asyncio
import re
import tomllib
import uuid

import numpy as np
import pytest

from activities.harness import episode_folder
from grove.client import connect
from grove.contracts import CodexOptions, EpisodeResult, EpisodeSpec, HarnessSpec
from grove.headers import LAUNCH_HEADER
from grove.sampling import SamplingConfig
from harnesses import codex, delegation
from harnesses.codex_install import codex_binary
from infra.temporal import TemporalDevServer
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import activity_attempts
from tests.e2e.test_acceptance import check_row_against_served
from tests.harnesses.opencode_kit import (
    RELAUNCH_HEARTBEAT_TIMEOUT_S,
    launch_events,
    opencode_stack,
    run_episode,
    until_reached,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

INSTRUCTIONS = "You answer with one word."
MAX_TOKENS = 128


@pytest.fixture(scope="module")
def cx_server(tmp_path_factory):
    """This module's own Temporal dev server (see tests/harnesses/test_opencode_runner.py `oc_server`)."""
    server = TemporalDevServer(tmp_path_factory.mktemp("cx-temporal")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def stack(cx_server, tiny_trained_model_dir, tmp_path_factory):
    await asyncio.to_thread(codex_binary)  # installs the pinned Codex on a fresh machine
    client = await connect(cx_server.address)
    async with opencode_stack(client, cx_server, tiny_trained_model_dir, tmp_path_factory.mktemp("cx")) as s:
        yield s


def codex_spec(name: str, **harness) -> EpisodeSpec:
    run = f"cx-{name}-{uuid.uuid4().hex[:6]}"
    options = CodexOptions(
        subagents=False, shell=False, instructions=INSTRUCTIONS, message="Say apple.", context_window=2048
    )
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/s000001/t0", episode_id=f"{run}/s000001/t0/g0",
        task=delegation.make_task(3),
        harness=HarnessSpec(kind="codex", codex=options, deadline_s=300, **harness),
        sampling=SamplingConfig(max_tokens=MAX_TOKENS),
    )  # fmt: skip


def _extends(served: dict, child: str, parent: str) -> bool:
    p, c = served[parent], served[child]
    prefix = np.concatenate([p.prompt_ids, p.completion_ids])
    return c.prompt_ids.size > prefix.size and np.array_equal(c.prompt_ids[: prefix.size], prefix)


async def test_runner_launches_codex_and_closes_the_episode(stack, tiny_tokenizer):
    """Stock Codex's turns reach the engine through the gateway's Responses API, each continuing the last
    on its exact tokens, and the episode closes with one row (a reply cut at its budget completes, marked
    incomplete: Codex goes on)."""
    spec = codex_spec("run")
    result = await run_episode(stack.client, spec)
    served = stack.engine.calls_of(spec.episode_id)
    calls = sorted(served, key=lambda c: int(c.rsplit(".c", 1)[1]))
    assert calls and calls[0] == "parent.0.c0" and all(c.startswith("parent.0.c") for c in calls), calls
    prompt = tiny_tokenizer.decode(served["parent.0.c0"].prompt_ids)
    assert INSTRUCTIONS in prompt and "Say apple." in prompt  # the catalog's instructions, the message
    assert '"name": "apply_patch"' in prompt and "exec_command" not in prompt
    for parent, child in zip(calls, calls[1:], strict=False):  # each turn continues the last exactly
        assert _extends(served, child, parent), (parent, child)
    assert result.status == "ok", result.failure
    assert result.counts == {"selected": len(calls)}
    [row] = rows_from_parquet(stack.store.get(result.rows_key))
    check_row_against_served(row, served)


def _in_order(served: dict) -> list[str]:
    return sorted(served, key=lambda c: int(c.rsplit(".c", 1)[1]))


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_relaunch_after_sigkill_is_answered_from_the_records(stack):
    """The harness worker is SIGKILLed after Codex got its answers and before the runner closed the episode
    (held there by a gate). The activity's retry relaunches Codex (a new thread id, `x-grove-launch: 2`),
    whose requests match the recorded calls: each is answered from its record, nothing generated or admitted
    again, and the relaunched Codex ends with the same final answer; the rows are those of the calls the
    engine served, each owned once."""
    spec = codex_spec("kill", heartbeat_timeout_s=RELAUNCH_HEARTBEAT_TIMEOUT_S)
    stack.gates.arm("harness_exited", f"^{re.escape(spec.episode_id)}$")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await until_reached(
            lambda: stack.gates.held("harness_exited"), "the first launch held after its exit", STATE_WAIT
        )
        first = launch_events(stack.harness_root, spec.episode_id)
        served_before = _in_order(stack.engine.calls_of(spec.episode_id))
        stack.harness.kill()
    finally:
        stack.gates.disarm("harness_exited")
    stack.harness.start()
    await stack.harness.wait_ready(stack.client)
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert result.status == "ok", result.failure
    assert await activity_attempts(handle, "run_harness") == [2]  # one relaunch after the lost launch
    served = [s.call_id for s in stack.engine.served if s.episode_id == spec.episode_id]
    assert served == served_before and served[0] == "parent.0.c0"  # each generated once, by launch 1
    assert result.counts == {"selected": len(served)}
    config_path = (
        codex.codex_home_for(episode_folder(stack.harness_root, spec.episode_id)) / codex.CONFIG_FILE
    )
    config = tomllib.loads(config_path.read_text())
    assert config["model_providers"][codex.PROVIDER]["http_headers"] == {LAUNCH_HEADER: "2"}
    again = launch_events(stack.harness_root, spec.episode_id)  # the relaunch's events replace the first's
    threads = [
        e["thread_id"] for events in (first, again) for e in events if e.get("type") == "thread.started"
    ]
    assert len(threads) == len(set(threads)) == 2  # a new Codex thread, answered from the first one's records
    assert codex.outcome_of_events(again) == codex.outcome_of_events(first)
    [row] = rows_from_parquet(stack.store.get(result.rows_key))
    check_row_against_served(row, stack.engine.calls_of(spec.episode_id))
    assert [s.call_id for s in row.spans if s.owned] == served
