"""The harness runner on real services: stock OpenCode (npm opencode-ai, pinned) launched per episode by
the `run_harness` activity, talking to the real gateway, Temporal dev server and vLLM on the tiny model.

What the engine served is read from the engine itself (RecordingEngine), never from grove's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import PendingActivityState

from activities.engine_config import EngineConfig
from activities.harness import episode_folder
from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from grove import queues
from grove.client import connect
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessHeartbeat, HarnessSpec, OpenCodeOptions
from grove.receipts import ContextOrigin
from grove.sampling import SamplingConfig
from harnesses import delegation
from harnesses.json_events import parse_events
from harnesses.opencode import (
    opencode_argv,
    opencode_config,
    opencode_env,
    outcome_of_events,
    setup_for,
)
from harnesses.opencode_install import opencode_binary
from infra.temporal import TemporalDevServer
from ledger.accounting import LedgerSummary
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import activity_attempts
from tests.e2e.test_acceptance import check_row_against_served, endpoint_of
from tests.fixtures.worker import RecordingEngine, worker_running
from tests.harnesses.eos_model import build_eos_model
from tests.harnesses.opencode_kit import (
    MAX_MODEL_LEN,
    RELAUNCH_HEARTBEAT_TIMEOUT_S,
    REPO,
    SECRET,
    launch_events,
    opencode_spec,
    opencode_stack,
    response_text,
    run_episode,
    until_reached,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

EOS_QUEUE = "inference-eos"


@pytest.fixture(scope="module")
def oc_server(tmp_path_factory):
    """This module's own Temporal dev server. Its stack runs workers of grove's queues in this process
    with a store and engines of its own: beside the session's worker (`grove_worker`, started by earlier
    modules) the SDK refuses a second worker of a queue on one client ("Registration of multiple workers
    with overlapping worker task types"), and on one server the session's worker would also take this
    stack's tasks with another store."""
    server = TemporalDevServer(tmp_path_factory.mktemp("oc-temporal")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def stack(oc_server, tiny_trained_model_dir, tmp_path_factory):
    await asyncio.to_thread(opencode_binary)  # installs the pinned OpenCode on a fresh machine
    client = await connect(oc_server.address)
    async with opencode_stack(client, oc_server, tiny_trained_model_dir, tmp_path_factory.mktemp("oc")) as s:
        yield s


async def test_runner_launches_opencode_and_closes_the_episode(stack, tiny_tokenizer):
    spec = opencode_spec("run")
    result = await run_episode(stack.client, spec)
    assert result.status == "ok", result.failure
    served = stack.engine.calls_of(spec.episode_id)
    assert sorted(served) == ["parent.0.c0"]  # the lead's one turn (title agent off, no task call)
    call = served["parent.0.c0"]
    prompt = tiny_tokenizer.decode(call.prompt_ids)
    assert "Words:\n" + "\n".join(spec.task.params["words"]) in prompt  # the family's first message
    assert '"name": "task"' in prompt  # the lead's only tool reached the template
    # The final answer the runner extracted is the text OpenCode printed: the served completion's. The
    # episode id (so the call's sampling seed) and OpenCode's prompt (its folder, the date) differ per
    # run, so the reply is a fresh draw: an EOS-only one (1 token, seen in a loaded suite run) prints no
    # text at all, which is what must happen then (tests/harnesses/eos_model.py drives that case on
    # purpose in test_an_empty_reply_left_out_by_opencode_continues_its_context).
    events = launch_events(stack.harness_root, spec.episode_id)
    texts = [e["part"]["text"].strip() for e in events if e["type"] == "text"]
    completion = response_text(tiny_tokenizer, call.completion_ids).strip()
    if completion:
        assert texts and texts[-1] == completion, (texts, completion)
    else:
        assert not any(texts), (texts, call.completion_ids)
    assert result.counts == {"selected": 1}
    [row] = rows_from_parquet(stack.store.get(result.rows_key))
    assert list(row.input_ids) == [*call.prompt_ids, *call.completion_ids]


async def test_heartbeat_shows_process_calls_and_last_request(stack):
    """Held mid-call by a gate: the pending run_harness activity's heartbeat names the live OpenCode
    process, the calls admitted so far and the time of the last request."""
    spec = opencode_spec("beat")
    stack.gates.arm("generate", f"^{spec.episode_id}/parent")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await until_reached(
            lambda: stack.gates.held("generate"), "the lead's call held in the engine", STATE_WAIT
        )
        beat = await _until_heartbeat(handle, lambda b: b.calls >= 1)
        assert beat.launch == 1 and beat.pid is not None
        os.kill(beat.pid, 0)  # the OpenCode process is alive (raises if not)
        assert beat.last_request is not None and beat.elapsed_s > 0
    finally:
        stack.gates.disarm("generate")
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert result.status == "ok", result.failure


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_an_over_long_prompt_is_refused_before_admission(stack):
    """OpenCode's default `build` agent sends ~15,000 tokens: the gateway answers 400
    context_length_exceeded before anything is admitted, so no call of the agent is ever generated;
    OpenCode then tries to compact (its reaction to that error), and the episode ends failed."""
    options = OpenCodeOptions(agents={"title": {"disable": True}}, default_agent="build")
    spec = opencode_spec("long", opencode=options, deadline_s=60)
    result = await run_episode(stack.client, spec)
    assert result.status == "failed", result
    served = stack.engine.calls_of(spec.episode_id)
    assert all("~" in call for call in served), served  # only auxiliary (summary) calls ran, if any
    print(f"over-long episode: failure={result.failure!r}; auxiliary calls served: {sorted(served)}")


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_relaunch_after_sigkill_is_answered_from_the_records(stack):
    """The harness worker is SIGKILLed after OpenCode got its answer and before the runner closed the
    episode (held there by a gate). The activity's retry relaunches OpenCode, whose request matches the
    recorded call: answered from the record, nothing generated or admitted again; the rows are those of an
    uninterrupted episode that made the same request: the served call's tokens and logprobs, once."""
    spec = opencode_spec("kill", heartbeat_timeout_s=RELAUNCH_HEARTBEAT_TIMEOUT_S)
    stack.gates.arm("harness_exited", f"^{re.escape(spec.episode_id)}$")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue="episodes", result_type=EpisodeResult
    )
    try:
        await until_reached(
            lambda: stack.gates.held("harness_exited"), "the first launch held after its exit", STATE_WAIT
        )
        served_before = list(stack.engine.calls_of(spec.episode_id))
        stack.harness.kill()
    finally:
        stack.gates.disarm("harness_exited")
    stack.harness.start()
    await stack.harness.wait_ready(stack.client)
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert result.status == "ok", result.failure
    assert await activity_attempts(handle, "run_harness") == [2]  # one relaunch after the lost launch
    served = [s for s in stack.engine.served if s.episode_id == spec.episode_id]
    assert [s.call_id for s in served] == served_before == ["parent.0.c0"]  # generated once
    assert result.counts == {"selected": 1}
    config = json.loads(
        (episode_folder(stack.harness_root, spec.episode_id) / "project" / "opencode.json").read_text()
    )
    assert config["provider"]["grove"]["options"]["headers"] == {"x-grove-launch": "2"}
    # The rows of an uninterrupted episode that made the same request: exactly the one call the engine
    # served (its prompt, its completion, its logprobs), owned once. (Re-running the same episode id as a
    # reference is refused by the store: rows and staging keys are deterministic per episode.)
    [row] = rows_from_parquet(stack.store.get(result.rows_key))
    check_row_against_served(row, stack.engine.calls_of(spec.episode_id))
    assert [s.call_id for s in row.spans if s.owned] == ["parent.0.c0"]


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_opencode_honours_the_request_timeout_grove_writes(stack):
    """OpenCode gives up on a response whose headers are late by its provider's `headerTimeout`, and
    grove's gateway sends headers when generation ends. With `request_timeout_s=2` and the lead's call
    held in the engine by a gate (released only after OpenCode has exited, held there by a second gate),
    OpenCode re-sends the request while the first is still generating, is refused, and exits: the
    episode fails. So the keys grove writes are the ones OpenCode reads; grove's default writes them off
    (test_opencode_setup.py), and the launch's deadline bounds the episode instead."""
    spec = opencode_spec("slow", opencode=OpenCodeOptions(request_timeout_s=2))
    stack.gates.arm("generate", f"^{re.escape(spec.episode_id)}/parent")
    stack.gates.arm("harness_exited", f"^{re.escape(spec.episode_id)}$")
    handle = await stack.client.start_workflow(
        "EpisodeWorkflow", spec, id=spec.episode_id, task_queue="episodes", result_type=EpisodeResult
    )

    # `held` also lists keys of earlier tests of this module (released since): look for this episode's
    def exited() -> bool:
        return spec.episode_id in stack.gates.held("harness_exited")

    try:
        await until_reached(exited, "OpenCode exited, its first call held", STATE_WAIT)
        # the first call never left the engine while OpenCode ran
        assert [k for k in stack.gates.held("generate") if k.startswith(f"{spec.episode_id}/parent")]
    finally:
        stack.gates.disarm("generate")
        stack.gates.disarm("harness_exited")
    result = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert result.status == "failed", result
    assert "still generating" in (result.failure or ""), result.failure  # the re-sent request, refused
    assert sorted(stack.engine.calls_of(spec.episode_id)) == ["parent.0.c0"]  # generated once


async def test_a_hand_run_harness_on_an_episode_started_by_the_cli(stack, oc_server, tmp_path):
    """`grove episode start --external` prints base URL, token and the episode's sampling; stock OpenCode
    run by hand with them is captured, and the close URL ends the episode. OpenCode names no
    temperature (its model entry lacks `"temperature": true`): the call is sampled, and its row
    recorded, at the episode's `--temperature` / `--top-p`."""
    eid = f"oc-hand-{uuid.uuid4().hex[:6]}/g0"
    env = {**os.environ, "GROVE_GATEWAY_SECRET": SECRET, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "cli.main", "episode", "start", "--external", "--id", eid, "--task", "3",
        "--gateway-url", stack.gateway_url, "--max-tokens", "48", "--temperature", "0.6", "--top-p", "0.9",
        "--address", oc_server.address, "--json",
    ]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=STATE_WAIT
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["base_url"].startswith(stack.gateway_url) and printed["token"].startswith("grove-")
    assert printed["sampling"] == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 48}
    project, home = tmp_path / "project", tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    project.mkdir()
    setup = setup_for(delegation.make_task(3), OpenCodeOptions())
    config = opencode_config(
        setup, printed["base_url"], printed["token"], launch=1, context_limit=2048, output_limit=48
    )
    (project / "opencode.json").write_text(json.dumps(config))
    binary = str(opencode_binary())
    ran = await asyncio.to_thread(
        _run_group, opencode_argv(binary, setup.message), project, opencode_env(str(home)), 300
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    answer = outcome_of_events(parse_events(ran.stdout.splitlines())).final_answer
    async with httpx.AsyncClient(timeout=300) as http:
        closed = await http.post(
            printed["close_url"], params={"wait": "true"}, json={"final_answer": answer},
            headers={"authorization": f"Bearer {printed['token']}"},
        )  # fmt: skip
    assert closed.status_code == 200, closed.text
    result = closed.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 1}
    assert list(stack.engine.calls_of(eid)) == ["parent.0.c0"]
    [row] = rows_from_parquet(stack.store.get(result["rows_key"]))
    assert [(s.temperature, s.top_p) for s in row.spans] == [(0.6, 0.9)]  # the episode's, not 1.0


async def _until_heartbeat(handle, accept, timeout: float = STATE_WAIT) -> HarnessHeartbeat:
    from temporalio.converter import DataConverter

    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        desc = await handle.describe()
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name != "run_harness" or not pending.heartbeat_details.payloads:
                continue
            assert pending.state in (PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,)
            [raw] = await DataConverter.default.decode(pending.heartbeat_details.payloads, [dict])
            beat = HarnessHeartbeat.model_validate(raw)
            if accept(beat):
                return beat
        await asyncio.sleep(0.5)
    raise AssertionError("no heartbeat of run_harness with the expected details")


# ---------------------------------------------------------------------------------------------- part 6


@pytest.fixture(scope="module")
async def eos_queue(stack, tmp_path_factory):
    """A second engine on its own inference queue serving a policy that always ends its turn at once
    (tests/harnesses/eos_model.py): real EOS-only replies. One for the module: each test reads the calls
    of its own episodes only (`calls_of`)."""
    folder = tmp_path_factory.mktemp("eos")
    model = build_eos_model(stack.model_dir, folder / "eos-model")
    engine = await RecordingEngine.start(EngineConfig(model_dir=model, max_model_len=MAX_MODEL_LEN))
    engine.served = []
    try:
        async with worker_running(
            stack.client, [queues.INFERENCE], store=stack.store, model=str(model), work_dir=folder / "w",
            engine=engine, inference_queue=EOS_QUEUE,
        ):  # fmt: skip
            yield engine
    finally:
        await engine.shutdown()


async def _external_episode(stack, name: str) -> tuple[str, str, str]:
    eid = f"oc-{name}-{uuid.uuid4().hex[:6]}/g0"
    spec = EpisodeSpec(
        run_id="adhoc", step=0, group_id=f"{eid}/group", episode_id=eid, task=delegation.make_task(3),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=8),
        inference_queue=EOS_QUEUE,
    )  # fmt: skip
    await stack.client.start_workflow("EpisodeWorkflow", spec, id=eid, task_queue=queues.EPISODES)
    base = f"{stack.gateway_url}/episodes/{episode_ref(eid)}"
    return eid, base, issue_token(SECRET, eid)


def _run_group(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """Run a harness in its own process group, which is SIGKILLed whatever happens (OpenCode ignores
    SIGTERM): nothing it started outlives the call, so no pipe is held open and no thread left waiting."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.communicate()  # the group is dead: its pipes close
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _opencode(project: Path, home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    argv = [str(opencode_binary()), "run", "--pure", "--format", "json", *args]
    return _run_group(argv, project, opencode_env(str(home)), timeout)


OUTPUT_LIMIT = 8  # OpenCode's limit.output: its compaction threshold is limit.context - limit.output
MARGIN = 40  # tokens between run 1's usage and the compaction threshold (the post-compaction prompt is
# ~75 tokens longer than OpenCode's fixed prompt, run 1's ~150: ~35 tokens of margin on that side)


def _project(
    tmp_path: Path, base: str, token: str, context_limit: int, exist_ok: bool = False
) -> tuple[Path, Path]:
    project, home = tmp_path / "project", tmp_path / "home"
    (home / "tmp").mkdir(parents=True, exist_ok=exist_ok)
    project.mkdir(exist_ok=exist_ok)
    setup = setup_for(delegation.make_task(3), OpenCodeOptions())
    config = opencode_config(
        setup, f"{base}/v1", token, launch=1, context_limit=context_limit, output_limit=OUTPUT_LIMIT
    )
    (project / "opencode.json").write_text(json.dumps(config))
    return project, home


async def _close(base: str, token: str) -> dict:
    async with httpx.AsyncClient(timeout=300) as http:
        closed = await http.post(
            f"{base}/close", params={"wait": "true"}, json={}, headers={"authorization": f"Bearer {token}"}
        )
    assert closed.status_code == 200, closed.text
    return closed.json()["result"]


async def test_an_empty_reply_left_out_by_opencode_continues_its_context(stack, eos_queue, tmp_path):
    """Real OpenCode, real EOS-only replies: the session's next request leaves the empty assistant turn
    out; the gateway continues the context (no 400), the empty call is discarded (accounted, untrained)
    and the next call's prompt is the history OpenCode sent."""
    eid, base, token = await _external_episode(stack, "empty")
    project, home = _project(tmp_path, base, token, context_limit=4096)
    first = await asyncio.to_thread(_opencode, project, home, "hello")
    assert first.returncode == 0, first.stderr[-2000:]
    session = next(e["sessionID"] for e in parse_events(first.stdout.splitlines()) if e.get("sessionID"))
    second = await asyncio.to_thread(_opencode, project, home, "--session", session, "again")
    assert second.returncode == 0, second.stderr[-2000:]
    assert not [e for e in parse_events(second.stdout.splitlines()) if e.get("type") == "error"]
    result = await _close(base, token)
    served = eos_queue.calls_of(eid)
    assert sorted(served) == ["parent.0.c0", "parent.0.c1"]
    end = stack_tokenizer(stack).convert_tokens_to_ids("<|im_end|>")
    assert all(list(s.completion_ids) == [end] for s in served.values())  # EOS-only, both
    assert result["counts"] == {"discarded": 1, "selected": 1}
    text = stack_tokenizer(stack).decode(served["parent.0.c1"].prompt_ids)
    assert "hello" in text and "again" in text
    assert "<|im_start|>assistant\n<|im_end|>" not in text  # the empty turn is not in what the engine saw
    [row] = rows_from_parquet(stack.store.get(result["rows_key"]))
    c1 = served["parent.0.c1"]
    assert list(row.input_ids) == [*c1.prompt_ids, *c1.completion_ids]
    assert row.loss_mask.astype(int).tolist() == [0] * len(c1.prompt_ids) + [1]


async def test_an_empty_compaction_summary_is_followed_by_a_recognised_rewrite(stack, eos_queue, tmp_path):
    """Real OpenCode compacts once, and the always-EOS policy makes its summary empty. Run 1 sends a long
    message (answered with EOS). Run 2's `limit.context` is set from the engine's own count of run 1's
    prompt so that run 1's usage is over OpenCode's threshold (limit.context - limit.output) by a margin
    while the post-compaction prompt (the long message replaced by two short ones) is under it by one:
    exactly one compaction, no loop. The empty summary is left out of the post-compaction request, which
    the gateway takes as OpenCode's rewrite (a new parent context, not a 400); run 3's request omits that
    context's empty reply and continues it. The summary is auxiliary and the omitted empty reply
    discarded: accounted, never trained."""
    eid, base, token = await _external_episode(stack, "compact")
    long_message = " ".join(["the cat"] * 75)  # 151 tokens in tiny's tokenizer: run 1 still fits 2,048
    project, home = _project(tmp_path, base, token, context_limit=4096)
    first = await asyncio.to_thread(_opencode, project, home, long_message)
    assert first.returncode == 0, first.stderr[-2000:]
    session = next(e["sessionID"] for e in parse_events(first.stdout.splitlines()) if e.get("sessionID"))
    [c0] = eos_queue.calls_of(eid).values()
    usage = c0.prompt_ids.size + c0.completion_ids.size  # what the gateway reported to OpenCode
    _project(tmp_path, base, token, context_limit=usage - MARGIN + OUTPUT_LIMIT, exist_ok=True)
    second = await asyncio.to_thread(_opencode, project, home, "--session", session, "again")
    assert second.returncode == 0, second.stderr[-2000:]
    third = await asyncio.to_thread(_opencode, project, home, "--session", session, "more")
    assert third.returncode == 0, third.stderr[-2000:]
    for run in (second, third):
        assert not [e for e in parse_events(run.stdout.splitlines()) if e.get("type") == "error"]
    summary = await stack.client.get_workflow_handle(eid).query("summary", result_type=LedgerSummary)
    result = await _close(base, token)
    served = eos_queue.calls_of(eid)
    tok = stack_tokenizer(stack)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(list(s.completion_ids) == [end] for s in served.values())  # every reply empty
    summaries = sorted(c for c in served if c.startswith("parent~summary"))
    assert len(summaries) == 1, sorted(served)  # one compaction, no loop
    assert sorted(c for c in served if not c.startswith("parent~")) == [
        "parent.0.c0", "parent.1.c0", "parent.1.c1"
    ], sorted(served)  # fmt: skip
    contexts = {c.context_id: c for c in summary.contexts}
    assert contexts["parent.1"].origin == ContextOrigin.REWRITE
    # the post-compaction request: OpenCode's question and continuation, the empty summary left out
    after = tok.decode(served["parent.1.c0"].prompt_ids)
    assert "What did we do so far?" in after and "Continue if you have next steps" in after
    assert "the cat the cat" not in after and "<|im_start|>assistant\n<|im_end|>" not in after
    assert served["parent.1.c0"].prompt_ids.size + 1 < usage - MARGIN  # under the threshold: no loop
    # run 3 continues the rewritten context: its prompt is parent.1.c0's history (without the generation
    # prompt that awaited the empty reply, which OpenCode left out) followed by the new message
    c0, c1 = served["parent.1.c0"], served["parent.1.c1"]
    opening = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    history = c0.prompt_ids.size - len(opening)
    assert list(c0.prompt_ids[history:]) == opening
    assert list(c1.prompt_ids[:history]) == list(c0.prompt_ids[:history])
    assert "more" in tok.decode(c1.prompt_ids[history:])
    # accounting: every served call once; the summary auxiliary, the omitted empty reply discarded; run 1's
    # empty reply, which nothing omitted (its context was rewritten), stays the selected end of its context
    print(f"empty compaction summary: counts {result['counts']}, served {sorted(served)}")
    assert result["counts"] == {"auxiliary": 1, "discarded": 1, "selected": 2}, result["counts"]
    rows = rows_from_parquet(stack.store.get(result["rows_key"]))
    assert sorted(endpoint_of(r) for r in rows) == ["parent.0.c0", "parent.1.c1"]
    for row in rows:
        check_row_against_served(row, served)  # exactly the served tokens; loss on its own reply only
    owned = sorted(s.call_id for r in rows for s in r.spans if s.owned)
    assert owned == ["parent.0.c0", "parent.1.c1"]  # neither the summary nor the omitted empty reply


def stack_tokenizer(stack):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(stack.model_dir))
