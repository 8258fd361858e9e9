"""Record the Temporal histories that tests/workflows/test_replay.py replays through current workflow code.

    .venv/bin/python -m tests.workflows.record_histories

It starts its own Temporal dev server (temporary SQLite file), an in-process grove worker for the
episodes, io and trainer queues, and a real inference worker (vLLM on the tiny-random model, a
temporary local object store), then records three finished workflows:

- `episode_lost_attempt`: an EpisodeWorkflow of the `scenario` program whose first generate attempt
  is lost. A hung inference worker (a subprocess whose `generate` never returns nor heartbeats) takes
  it and is SIGKILLed; the attempt times out after the 20 s heartbeat timeout, is recorded as
  discarded and re-admitted as `parent.0.c0.r1`, which the real inference worker serves: the
  workflow's crash-recovery branch;
- `episode_scenario`: the same program with nothing lost (parent, two overlapping workers, a compaction);
- `training_run`: a TrainingRunWorkflow of 2 steps (1 task x group of 2 per step: child episodes,
  train_step, publish_weights).

A fourth history is recorded on its own, by the workflow code of a past commit, never re-recorded by
the command above:

    .venv/bin/python -m tests.workflows.record_histories --pre-bound-run

Two more, also by past workflow code, on their own:

    .venv/bin/python -m tests.workflows.record_histories --pre-settle-episode

- `episode_pre_settle_handover`, `episode_pre_settle_close`: the second and third workflow runs of one
  external episode (open_context + 9 calls through the gateway's Updates, a hand-over every 4 Updates,
  ledger pages of 2 items) run by the EpisodeWorkflow from before calls were settled (workflows/
  episode.py of PRE_SETTLE_COMMIT): run 2 restores a paged ledger and hands over as pages again (the
  whole ledger), run 3 restores it, pages it before its close and materializes. Today's code must replay
  both without settling (patched in: `grove-settle-calls`).

Three more, by today's workflow code, on their own (the claim check and the settle, which the histories
above never took):

    .venv/bin/python -m tests.workflows.record_histories --by-ref-episode

- `episode_by_ref_handover`, `episode_by_ref_close`: the second and third workflow runs of one external
  episode (open_context + 9 calls of BY_REF_TOKENS tokens each, every completion over
  COMPLETION_INLINE_MAX so it crosses Temporal by reference; a hand-over every 4 Updates, ledger pages of
  4 items, `branch_window=2`): run 2 restores run 1's inline ledger, takes 4 by-reference calls, writes its
  pages and index and settles (its carry: the 3 live calls inline and the settled tails), run 3 pages its
  ledger before its close and materializes by following the index chain;
- `episode_native_by_ref`: the `long-conversation` native program with 2 turns of BY_REF_TOKENS tokens:
  each generate result is a reference, read through `load_completion`, and the second call is a
  `chat_delta` naming the first call's stored conversation (its result's `conversation_ref`).

- `training_run_pre_bound`: a TrainingRunWorkflow of 2 steps run by the workflow code from before the
  run's history was bounded (workflows/training_run.py of PRE_BOUND_COMMIT, read from git; every other
  module is today's). It was started with `carried_history_steps=1` (a client that knows the field, a
  worker that does not), so its state ends with 2 records, more than the bound, and no
  `archive_step_records` activity: what a run started before the bound, past 100 steps, has recorded.
  Today's code must replay it (the bound is patched in: `grove-bound-run-history`).

Each finished workflow's history (`handle.fetch_history().to_json()`, re-indented) is written to
tests/workflows/histories/<name>.json, replacing the file there. Everything the script started is
stopped (by PID) and its temporary folder deleted when it ends.

When to re-record: only after an *intentional* change to workflows/ (or to code they run inside the
sandbox: harnesses/native.py, harnesses/scenario.py, grove/data_order.py) that
changes the commands a workflow issues — then test_replay.py fails with a nondeterminism error, which
is its job. Before re-recording, decide whether runs already in flight must survive the change: if
so, guard the new behaviour with `workflow.patched(...)` instead (histories recorded before the change
must keep replaying; keep the old JSON files and add new ones). Commit the re-recorded JSON files
together with the workflow change that made them necessary.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.worker import Worker

from cli.worker import STICKY_TIMEOUT, run_worker
from grove import queues
from grove.client import connect, workflow_runs
from grove.contracts import (
    CloseRequest,
    EpisodeResult,
    EpisodeSpec,
    GenerateInput,
    GenerateResult,
    HarnessSpec,
    RunConfig,
    RunResult,
    RunState,
    TaskSpec,
)
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.temporal import TemporalDevServer
from storage.local import LocalStore
from workflows.episode import EpisodeWorkflow
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-random"  # a registry name, not a path: the recorded inputs hold no machine-specific folder
SAMPLING = SamplingConfig(max_tokens=8)

EPISODE_ID = "replay/episode/t0/g0"
LOST_EPISODE_ID = "replay/lost/t0/g0"
RUN_ID = "replay-run"
PRE_BOUND_RUN_ID = "replay-run-pre-bound"
# the last commit whose workflows/training_run.py kept every StepRecord (no archive_step_records)
PRE_BOUND_COMMIT = "e829cd1^"
PRE_SETTLE_EPISODE_ID = "replay/pre-settle/t0/g0"
# the last commit whose workflows/episode.py handed a paged ledger over whole (no settle)
PRE_SETTLE_COMMIT = "4fcddce"
BY_REF_EPISODE_ID = "replay/by-ref/t0/g0"
NATIVE_BY_REF_EPISODE_ID = "replay/native-by-ref/t0/g0"
BY_REF_TOKENS = 400  # each completion's tokens (ignore_eos): its inline form is over COMPLETION_INLINE_MAX


class RecordingError(RuntimeError):
    """The recording did not go as planned (a worker died, an episode ended otherwise than expected)."""


def episode_spec(episode_id: str) -> EpisodeSpec:
    group = episode_id.rsplit("/", 1)[0]
    return EpisodeSpec(
        run_id="replay", step=0, group_id=group, episode_id=episode_id,
        task=scenario.make_task(0), harness=HarnessSpec(program=scenario.NAME), sampling=SAMPLING,
    )  # fmt: skip


def run_config(run_id: str = RUN_ID, **extra) -> RunConfig:
    return RunConfig(
        run_id=run_id, model=MODEL, seed=0, steps=2, task_family=scenario.NAME, num_tasks=4, tasks_per_step=1,
        group_size=2, harness=HarnessSpec(program=scenario.NAME), sampling=SAMPLING,
        learner=LearnerConfig(lr=1e-3), **extra,
    )  # fmt: skip


# ------------------------------------------------------------------------------ the hung worker


@activity.defn(name="generate")
async def hung_generate(inp: GenerateInput) -> GenerateResult:
    await asyncio.Event().wait()  # never returns, never heartbeats: the process is killed meanwhile
    raise AssertionError("unreachable")


async def serve_hung_inference(address: str) -> None:
    """`--hung-worker ADDRESS`: an inference worker that takes generate tasks and never finishes them."""
    client = await connect(address)
    await Worker(client, task_queue=queues.INFERENCE, activities=[hung_generate]).run()


def start_hung_worker(address: str, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.workflows.record_histories", "--hung-worker", address],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


async def generate_started(handle, timeout: float = 120.0) -> None:
    """Until the workflow has a started `generate` activity (taken by a worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            desc = await handle.describe()
        except Exception:  # not started yet
            desc = None
        if desc is not None and any(
            a.activity_type.name == "generate"
            and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            for a in desc.raw_description.pending_activities
        ):
            return
        await asyncio.sleep(0.1)
    raise RecordingError(
        f"{handle.id}: no generate activity started within {timeout:.0f} s (is the hung worker up?)"
    )


# ------------------------------------------------------------------------------ recording


async def _record(name: str, handle) -> Path:
    history = await handle.fetch_history()
    path = HISTORIES / f"{name}.json"
    # re-indented for reviewable diffs; WorkflowHistory.from_json reads it back as it is
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1, sort_keys=True) + "\n")
    return path


async def _while_workers_run(aw, workers: list[asyncio.Task]):
    """Await `aw`; fail at once if a worker task ends first (a worker that failed to start)."""
    job = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({job, *workers}, return_when=asyncio.FIRST_COMPLETED)
    if job not in done:
        job.cancel()
        dead = next(iter(done))
        raise RecordingError(f"a worker stopped while recording: {dead.exception()!r}") from dead.exception()
    return job.result()


async def _episode(client, episode_id: str, expect_discarded: int):
    handle = client.get_workflow_handle(episode_id, result_type=EpisodeResult)
    result = await handle.result()
    if result.status != "ok" or result.counts.get("discarded", 0) != expect_discarded:
        raise RecordingError(
            f"episode {episode_id}: expected ok with {expect_discarded} discarded, got {result}"
        )
    return handle


async def _start_episode(client, spec: EpisodeSpec):
    return await client.start_workflow(
        EpisodeWorkflow.run, spec, id=spec.episode_id, task_queue=queues.EPISODES, result_type=EpisodeResult,
    )  # fmt: skip


async def _stop_workers(workers: list[asyncio.Task]) -> None:
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def record(work: Path) -> list[Path]:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    store = LocalStore(work / "store")
    with TemporalDevServer(work / "temporal") as server:
        client = await connect(server.address)
        workers = [
            asyncio.create_task(
                run_worker(client, [queues.EPISODES, queues.IO, queues.TRAINER], store=store, model=MODEL,
                           work_dir=work / "worker", device="cpu")
            )
        ]  # fmt: skip
        hung = start_hung_worker(server.address, work / "hung-worker.log")
        try:
            lost = await _start_episode(client, episode_spec(LOST_EPISODE_ID))
            await _while_workers_run(generate_started(lost), workers)
            kill_group(hung)  # the attempt it holds is lost; the real inference worker starts only now
            workers.append(
                asyncio.create_task(
                    run_worker(client, [queues.INFERENCE], store=store, model=MODEL, work_dir=work / "worker")
                )
            )
            await _while_workers_run(_episode(client, LOST_EPISODE_ID, expect_discarded=1), workers)
            await _start_episode(client, episode_spec(EPISODE_ID))
            episode = await _while_workers_run(_episode(client, EPISODE_ID, expect_discarded=0), workers)
            run = await client.start_workflow(
                TrainingRunWorkflow.run, RunState(config=run_config()), id=RUN_ID, task_queue=queues.EPISODES,
                result_type=RunResult,
            )  # fmt: skip
            await _while_workers_run(run.result(), workers)
            return [
                await _record("episode_lost_attempt", lost),
                await _record("episode_scenario", episode),
                await _record("training_run", run),
            ]
        finally:
            kill_group(hung)
            await _stop_workers(workers)


def past_module(folder: Path, commit: str, path: str, name: str) -> object:
    """`path` as of `commit`, written to `folder` as module `name` and imported from there (the sandbox
    re-imports a workflow's module by name, from sys.path); every module it imports is today's."""
    source = subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def pre_bound_workflow(folder: Path) -> type:
    """The TrainingRunWorkflow of PRE_BOUND_COMMIT."""
    module = past_module(
        folder, PRE_BOUND_COMMIT, "workflows/training_run.py", "grove_pre_bound_training_run"
    )
    if "archive_step_records" in Path(module.__file__).read_text():
        raise RecordingError(f"{PRE_BOUND_COMMIT}:workflows/training_run.py already archives step records")
    return module.TrainingRunWorkflow


async def _runs_of(client, workflow_id: str) -> list:
    """Handles of the workflow's runs, first to last."""
    return [
        client.get_workflow_handle(workflow_id, run_id=h.run_id)
        for h in await workflow_runs(client, workflow_id)
    ]


async def record_pre_settle(work: Path) -> list[Path]:
    from gateway.temporal.episode_client import Episodes
    from tests.episodes.kit import ROOT, call_request

    module = past_module(
        work / "pre-settle", PRE_SETTLE_COMMIT, "workflows/episode.py", "grove_pre_settle_episode"
    )
    if "SETTLE_PATCH" in Path(module.__file__).read_text():
        raise RecordingError(f"{PRE_SETTLE_COMMIT}:workflows/episode.py already settles calls")
    store = LocalStore(work / "store")
    with TemporalDevServer(work / "temporal") as server:
        client = await connect(server.address)
        episodes_worker = Worker(
            client, task_queue=queues.EPISODES, workflows=[module.EpisodeWorkflow],
            sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        )  # fmt: skip
        workers = [
            asyncio.create_task(episodes_worker.run()),
            asyncio.create_task(
                run_worker(client, [queues.IO, queues.INFERENCE], store=store, model=MODEL,
                           work_dir=work / "worker", device="cpu")
            ),
        ]  # fmt: skip
        try:
            spec = EpisodeSpec(
                run_id="replay", step=0, group_id="replay/pre-settle/t0", episode_id=PRE_SETTLE_EPISODE_ID,
                task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
                sampling=SamplingConfig(max_tokens=1), max_updates_per_run=4, ledger_page_items=2,
            )  # fmt: skip
            await client.start_workflow(
                "EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES
            )
            episodes = Episodes(client)

            async def drive() -> EpisodeResult:
                await episodes.open_context(spec.episode_id, ROOT)
                for i in range(9):
                    await episodes.call(spec.episode_id, call_request(spec.episode_id, i))
                await episodes.close(spec.episode_id, CloseRequest(final_answer="done"))
                return await episodes.result(spec.episode_id)

            result = await _while_workers_run(drive(), workers)
            runs = await _runs_of(client, spec.episode_id)
            if result.status != "ok" or result.counts != {"selected": 9} or len(runs) != 3:
                raise RecordingError(
                    f"{spec.episode_id}: expected ok, 9 selected, 3 runs; got {result}, {runs}"
                )
            return [
                await _record("episode_pre_settle_handover", runs[1]),
                await _record("episode_pre_settle_close", runs[2]),
            ]
        finally:
            await _stop_workers(workers)


async def _by_ref_external(client) -> list:
    """The external episode of `--by-ref-episode`: its runs, first to last."""
    from gateway.temporal.episode_client import Episodes
    from tests.episodes.kit import ROOT, call_request

    sampling = SamplingConfig(max_tokens=BY_REF_TOKENS, ignore_eos=True)
    spec = EpisodeSpec(
        run_id="replay", step=0, group_id="replay/by-ref/t0", episode_id=BY_REF_EPISODE_ID,
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"), sampling=sampling,
        max_updates_per_run=4, ledger_page_items=4, branch_window=2,
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    episodes = Episodes(client)
    await episodes.open_context(spec.episode_id, ROOT)
    calls = []
    for i in range(9):  # as the gateway asks (gateway/pipeline/execution.py): a large completion by reference
        request = call_request(spec.episode_id, i).model_copy(update={"completion_by_ref": True})
        calls.append(await episodes.call(spec.episode_id, request))
    await episodes.close(spec.episode_id, CloseRequest(final_answer="done"))
    result = await episodes.result(spec.episode_id)
    runs = await _runs_of(client, spec.episode_id)
    inline = [c.call_id for c in calls if c.completion_ref is None]
    if result.status != "ok" or result.counts != {"selected": 9} or len(runs) != 3 or inline:
        raise RecordingError(
            f"{spec.episode_id}: expected ok, 9 selected, 3 runs, every completion by reference; got "
            f"{result}, {len(runs)} runs, inline: {inline}"
        )
    return runs


async def record_by_ref(work: Path) -> list[Path]:
    store = LocalStore(work / "store")
    with TemporalDevServer(work / "temporal") as server:
        client = await connect(server.address)
        workers = [
            asyncio.create_task(
                run_worker(client, [queues.EPISODES, queues.IO, queues.INFERENCE], store=store, model=MODEL,
                           work_dir=work / "worker", device="cpu")
            )
        ]  # fmt: skip
        try:
            runs = await _while_workers_run(_by_ref_external(client), workers)
            spec = episode_spec(NATIVE_BY_REF_EPISODE_ID).model_copy(
                update={
                    "task": TaskSpec(family=scenario.NAME, task_id="long-2", params={"turns": 2}),
                    "harness": HarnessSpec(program=scenario.LONG_NAME),
                    "sampling": SamplingConfig(max_tokens=BY_REF_TOKENS, ignore_eos=True),
                }
            )
            native = await _start_episode(client, spec)
            result = await _while_workers_run(native.result(), workers)
            if result.status != "ok" or result.counts != {"selected": 2} or result.num_rows != 1:
                raise RecordingError(f"{spec.episode_id}: expected ok, 2 selected, 1 row; got {result}")
            return [
                await _record("episode_by_ref_handover", runs[1]),
                await _record("episode_by_ref_close", runs[2]),
                await _record("episode_native_by_ref", native),
            ]
        finally:
            await _stop_workers(workers)


async def record_pre_bound(work: Path) -> list[Path]:
    old_run = pre_bound_workflow(work / "pre-bound")
    store = LocalStore(work / "store")
    with TemporalDevServer(work / "temporal") as server:
        client = await connect(server.address)
        episodes = Worker(
            client, task_queue=queues.EPISODES, workflows=[EpisodeWorkflow, old_run],
            sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        )  # fmt: skip
        workers = [
            asyncio.create_task(episodes.run()),
            asyncio.create_task(
                run_worker(client, [queues.IO, queues.TRAINER, queues.INFERENCE], store=store, model=MODEL,
                           work_dir=work / "worker", device="cpu")
            ),
        ]  # fmt: skip
        try:
            state = RunState(config=run_config(PRE_BOUND_RUN_ID, carried_history_steps=1))
            run = await client.start_workflow(
                "TrainingRunWorkflow", state, id=PRE_BOUND_RUN_ID, task_queue=queues.EPISODES,
                result_type=RunResult,
            )  # fmt: skip
            result = await _while_workers_run(run.result(), workers)
            if [r.step for r in result.history] != [1, 2]:
                raise RecordingError(f"{PRE_BOUND_RUN_ID}: expected both records carried, got {result}")
            return [await _record("training_run_pre_bound", run)]
        finally:
            await _stop_workers(workers)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--hung-worker":
        asyncio.run(serve_hung_inference(sys.argv[2]))
        return
    jobs = {
        "--pre-bound-run": record_pre_bound,
        "--pre-settle-episode": record_pre_settle,
        "--by-ref-episode": record_by_ref,
    }
    job = jobs.get(sys.argv[1], record) if len(sys.argv) == 2 else record
    work = Path(tempfile.mkdtemp(prefix="grove-record-histories-"))
    try:
        for path in asyncio.run(job(work)):
            print(f"wrote {path} ({path.stat().st_size} bytes)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
