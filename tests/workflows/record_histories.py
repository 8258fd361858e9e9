"""Record the Temporal histories that tests/workflows/test_replay.py replays through current workflow code.

    .venv/bin/python -m tests.workflows.record_histories          # ~1-2 min on 2 CPU cores

It starts its own Temporal dev server (temporary SQLite file) and one in-process grove worker serving
every queue (vLLM on the tiny-random model, a temporary local object store), runs

- `episode_lost_attempt`: an EpisodeWorkflow of the `scenario` program whose first generate attempt
  is lost: it is picked up by a stalled inference worker that never heartbeats (a hung host), times
  out after the 20 s heartbeat timeout, is recorded as discarded and re-admitted as `parent.0.c0.r1`,
  which the real worker serves (the workflow's crash-recovery branch);
- `episode_scenario`: the same program with nothing lost (parent, two overlapping workers, a compaction);
- `training_run`: a TrainingRunWorkflow of 2 steps (1 task x group of 2 per step: child episodes,
  train_step, publish_weights),

and writes each finished workflow's history (`handle.fetch_history().to_json()`) to
tests/workflows/histories/<name>.json, replacing the files there. Everything else it started is
stopped and deleted when it ends.

When to re-record: only after an *intentional* change to workflows/ (or to code they run inside the
sandbox: harnesses/native.py, harnesses/scenario.py, workflows/ledger.py, grove/data_order.py) that
changes the commands a workflow issues — then test_replay.py fails with a nondeterminism error, which
is its job. Before re-recording, decide whether runs already in flight must survive the change: if
so, guard the new behaviour with `workflow.patched(...)` instead (histories recorded before the change
must keep replaying; keep the old JSON files and add new ones). Commit the re-recorded JSON files
together with the workflow change that made them necessary.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.sampling import SamplingConfig
from grove import queues
from grove.client import connect
from grove.contracts import (
    EpisodeResult,
    EpisodeSpec,
    GenerateInput,
    GenerateResult,
    HarnessSpec,
    RunConfig,
    RunResult,
    RunState,
)
from grove.worker import run_worker
from harnesses import scenario
from infra.temporal import TemporalDevServer
from storage.local import LocalStore
from trainer.config import LearnerConfig
from workflows.episode import EpisodeWorkflow
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
MODEL = "tiny-random"  # a registry name, not a path: the recorded inputs hold no machine-specific folder
SAMPLING = SamplingConfig(max_tokens=8)

EPISODE_ID = "replay/episode/t0/g0"
LOST_EPISODE_ID = "replay/lost/t0/g0"
RUN_ID = "replay-run"


def episode_spec(episode_id: str) -> EpisodeSpec:
    group = episode_id.rsplit("/", 1)[0]
    return EpisodeSpec(
        run_id="replay", step=0, group_id=group, episode_id=episode_id,
        task=scenario.make_task(0), harness=HarnessSpec(program=scenario.NAME), sampling=SAMPLING,
    )  # fmt: skip


class StalledInference:
    """An inference worker that takes one generate task and hangs on it without heartbeating."""

    def __init__(self) -> None:
        self.caught = asyncio.Event()
        self.release = asyncio.Event()

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        self.caught.set()
        # Hang until released, long after the heartbeat timeout: the attempt is lost. The SDK cancels the
        # activity locally when its heartbeat timeout passes; a hung host would not notice, and keeping
        # the only slot busy keeps this worker from taking the retry.
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                continue
        raise ApplicationError(f"stalled worker released call {inp.call_id}")


def run_config() -> RunConfig:
    return RunConfig(
        run_id=RUN_ID, model=MODEL, seed=0, steps=2, task_family=scenario.NAME, num_tasks=4, tasks_per_step=1,
        group_size=2, harness=HarnessSpec(program=scenario.NAME), sampling=SAMPLING,
        learner=LearnerConfig(lr=1e-3),
    )  # fmt: skip


async def _record(client, name: str, handle) -> Path:
    history = await handle.fetch_history()
    path = HISTORIES / f"{name}.json"
    # re-indented for reviewable diffs; WorkflowHistory.from_json reads it back as it is
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1, sort_keys=True) + "\n")
    return path


async def _episode(client, episode_id: str, expect_discarded: int):
    handle = await client.start_workflow(
        EpisodeWorkflow.run, episode_spec(episode_id), id=episode_id, task_queue=queues.EPISODES,
        result_type=EpisodeResult,
    )  # fmt: skip
    result = await handle.result()
    if result.status != "ok" or result.counts.get("discarded", 0) != expect_discarded:
        raise RuntimeError(f"episode {episode_id}: unexpected result {result}")
    return handle


async def record(work: Path) -> list[Path]:
    HISTORIES.mkdir(parents=True, exist_ok=True)
    store = LocalStore(work / "store")
    with TemporalDevServer(work / "temporal") as server:
        client = await connect(server.address)
        stalled = StalledInference()
        hung = Worker(
            client, task_queue=queues.INFERENCE, activities=[stalled.generate], max_concurrent_activities=1
        )
        tasks = [
            asyncio.create_task(hung.run()),
            asyncio.create_task(
                run_worker(client, [queues.EPISODES, queues.IO, queues.TRAINER], store=store, model=MODEL,
                           work_dir=work / "worker", device="cpu")
            ),
        ]  # fmt: skip
        try:
            lost = asyncio.create_task(_episode(client, LOST_EPISODE_ID, expect_discarded=1))
            await asyncio.wait_for(stalled.caught.wait(), 120)
            # only now the real inference worker: every later attempt (the retry included) goes to it
            tasks.append(
                asyncio.create_task(
                    run_worker(client, [queues.INFERENCE], store=store, model=MODEL, work_dir=work / "worker")
                )
            )
            lost_handle = await lost
            episode = await _episode(client, EPISODE_ID, expect_discarded=0)
            run = await client.start_workflow(
                TrainingRunWorkflow.run, RunState(config=run_config()), id=RUN_ID, task_queue=queues.EPISODES,
                result_type=RunResult,
            )  # fmt: skip
            await run.result()
            return [
                await _record(client, "episode_lost_attempt", lost_handle),
                await _record(client, "episode_scenario", episode),
                await _record(client, "training_run", run),
            ]
        finally:
            stalled.release.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="grove-record-histories-"))
    try:
        for path in asyncio.run(record(work)):
            print(f"wrote {path} ({path.stat().st_size} bytes)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
