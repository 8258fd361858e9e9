"""Relaunch of a Python harness program (RunConfig.harness.kind `python`) on real services: the LangGraph
delegation program (harnesses/langgraph_delegation.py, the real langgraph / langchain packages) launched by
the `run_harness` activity in a `grove worker --queues harness` subprocess, the real gateway, the Temporal
dev server and vLLM on the tiny model.

The harness worker is SIGKILLed mid-episode: the program has had five calls answered (the lead's first turn;
worker-1's answer; worker-2's warm-up, its summary and its answer after the declared rewrite) and its lead has
sent its second request, held on arrival at the gateway by the `chat_request` gate (nothing admitted).
Temporal's retry relaunches the program (launch 2), which sends the same five requests again: each must be
answered from its record (gateway/pipeline/launch_records.py), nothing generated or admitted twice, and its
first new request must continue the lead's recorded call on its exact tokens. The held request of the dead
launch stays held until the episode is over, then meets a closed episode.

The Agents SDK delegation program (harnesses/agents_sdk_delegation.py, the real openai-agents package) is
killed the way the OpenCode relaunch test kills OpenCode: after the program exited, before the runner
closed the episode (the `harness_exited` gate). The relaunch re-sends all six requests, the lead's two
among them (without replay the lead's first request of the relaunch would be refused: 400), and the
worker with a history's three (its warm-up, its filter's summary call, its word after the declared
rewrite), and each is answered from its record.

What the engine served is read from the engine itself (RecordingEngine), never from grove's records.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec, PythonHarnessOptions
from grove.sampling import SamplingConfig
from harnesses import framework_delegation as fd
from infra.temporal import TemporalDevServer
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import activity_attempts
from tests.e2e.test_acceptance import check_row_against_served, endpoint_of
from tests.harnesses.opencode_kit import (
    RELAUNCH_HEARTBEAT_TIMEOUT_S,
    opencode_stack,
    response_text,
    until_reached,
)
from trainer.rows import rows_from_parquet

# minutes on 2 cores (a program launched, killed and relaunched per test): the `long` suite
pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow, pytest.mark.long]

PLAIN, COMPACTING = "worker-1", "worker-2"  # Send order (harnesses/clients/langgraph.py)
SUMMARY = f"{COMPACTING}~summary.0.c0"  # SummarizationMiddleware's call: auxiliary, in no row
BEFORE_KILL = ["parent.0.c0", f"{PLAIN}.0.c0", f"{COMPACTING}.0.c0", SUMMARY, f"{COMPACTING}.1.c0"]


@pytest.fixture(scope="module")
def py_server(tmp_path_factory):
    """This module's own Temporal dev server (see tests/harnesses/test_opencode_runner.py oc_server: the
    stack's in-process workers must not meet the session's grove_worker)."""
    server = TemporalDevServer(tmp_path_factory.mktemp("py-temporal")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def stack(py_server, tiny_model_dir, tmp_path_factory):
    from grove.client import connect

    client = await connect(py_server.address)
    async with opencode_stack(client, py_server, tiny_model_dir, tmp_path_factory.mktemp("py")) as s:
        yield s


def program_spec(name: str, family: str) -> EpisodeSpec:
    # A fixed episode id (this module's own dev server and store hold one episode of each name): it seeds
    # the calls (activities/generate.call_seed) and the programs' requests are fixed, so every run checks
    # the same replies. With a fresh id per run the checks met a fresh draw each time, and one draw breaks
    # them: an EOS-only first reply of the Agents SDK lead (P ~0.1 % on tiny-random) is no output item, so
    # its second request leaves the empty turn out and the gateway discards that call (counts, rows differ).
    run = f"py-{name}"
    harness = HarnessSpec(
        kind="python", python=PythonHarnessOptions(entry=fd.ENTRIES[family]),
        heartbeat_timeout_s=RELAUNCH_HEARTBEAT_TIMEOUT_S, deadline_s=300,
    )  # fmt: skip
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/s000001/t0", episode_id=f"{run}/s000001/t0/g0",
        task=fd.make_task_of(family)(3), harness=harness,
        sampling=SamplingConfig(max_tokens=10, temperature=0.7),
    )  # fmt: skip


async def test_a_relaunched_langgraph_program_is_answered_from_the_records(stack, tiny_tokenizer):
    spec = program_spec("lg-kill", fd.LANGGRAPH)
    eid = spec.episode_id
    # the lead's second request of launch 1: system, words, its reply, the workers' answers
    stack.gates.arm("chat_request", f"^{re.escape(eid)}/1/parent/4$")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=eid, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await until_reached(
            lambda: stack.gates.held("chat_request"), "the lead's second request held", STATE_WAIT
        )
        served_before = [s.call_id for s in stack.engine.served if s.episode_id == eid]
        stack.harness.kill()  # the worker and, with it (PR_SET_PDEATHSIG), the program
        stack.harness.start()
        await stack.harness.wait_ready(stack.client)
        result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    finally:
        stack.gates.disarm("chat_request")
    assert result.status == "ok", result.failure
    assert sorted(served_before) == sorted(BEFORE_KILL)  # the compacting worker made three calls
    assert await activity_attempts(handle, "run_harness") == [2]  # one relaunch after the lost launch
    # generated once each: the five answered before the kill were replayed, only the lead's second is new
    served = [s.call_id for s in stack.engine.served if s.episode_id == eid]
    assert served == [*served_before, "parent.0.c1"]
    assert result.counts == {"selected": 5, "auxiliary": 1}  # nothing admitted twice, nothing discarded

    calls = stack.engine.calls_of(eid)
    actions = sorted(set(BEFORE_KILL) - {SUMMARY} | {"parent.0.c1"})
    rows = rows_from_parquet(stack.store.get(result.rows_key))
    assert {endpoint_of(r): [s.call_id for s in r.spans] for r in rows} == {
        "parent.0.c1": ["parent.0.c0", "parent.0.c1"],
        f"{PLAIN}.0.c0": [f"{PLAIN}.0.c0"],
        f"{COMPACTING}.0.c0": [f"{COMPACTING}.0.c0"],
        f"{COMPACTING}.1.c0": [f"{COMPACTING}.1.c0"],
    }
    for row in rows:  # exact tokens and logprobs as served, each action owned once
        check_row_against_served(row, calls)
    assert sorted(s.call_id for r in rows for s in r.spans if s.owned) == actions
    # the relaunched lead read the workers' recorded answers: their served completions are in its prompt
    lead = tiny_tokenizer.decode(calls["parent.0.c1"].prompt_ids)
    for answer in (f"{PLAIN}.0.c0", f"{COMPACTING}.1.c0"):
        text = response_text(tiny_tokenizer, calls[answer].completion_ids).strip()
        assert text in lead, (answer, text)


async def test_a_relaunched_agents_sdk_program_is_answered_from_the_records(stack):
    spec = program_spec("sdk-kill", fd.AGENTS_SDK)
    eid = spec.episode_id
    plain, w = "Worker-call_w1", "Worker-call_w2"  # header_safe(f"{agent.name}-{tool call id}")
    actions = ["parent.0.c0", f"{plain}.0.c0", f"{w}.0.c0", f"{w}.1.c0", "parent.0.c1"]
    calls_made = [*actions, f"{w}~summary.0.c0"]  # the summary call: auxiliary, in no row
    stack.gates.arm("harness_exited", f"^{re.escape(eid)}$")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=eid, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await until_reached(
            lambda: stack.gates.held("harness_exited"), "the first launch held after its exit", STATE_WAIT
        )
        served_before = [s.call_id for s in stack.engine.served if s.episode_id == eid]
        stack.harness.kill()
    finally:
        stack.gates.disarm("harness_exited")
    stack.harness.start()
    await stack.harness.wait_ready(stack.client)
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert result.status == "ok", result.failure
    assert sorted(served_before) == sorted(calls_made)
    assert await activity_attempts(handle, "run_harness") == [2]
    # all six requests of the relaunch answered from the records: nothing generated again
    assert [s.call_id for s in stack.engine.served if s.episode_id == eid] == served_before
    assert result.counts == {"selected": 5, "auxiliary": 1}
    calls = stack.engine.calls_of(eid)
    rows = rows_from_parquet(stack.store.get(result.rows_key))
    assert {endpoint_of(r): [s.call_id for s in r.spans] for r in rows} == {
        "parent.0.c1": ["parent.0.c0", "parent.0.c1"],
        **{f"{a}.0.c0": [f"{a}.0.c0"] for a in (plain, w)},
        f"{w}.1.c0": [f"{w}.1.c0"],
    }
    for row in rows:
        check_row_against_served(row, calls)
    assert sorted(s.call_id for r in rows for s in r.spans if s.owned) == sorted(actions)
