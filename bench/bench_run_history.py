"""Benchmark: Temporal history bytes of a training run, per run step and per episode.

Real services in one process: a Temporal dev server (temporary SQLite), a grove worker serving every
queue (episodes, io, inference with vLLM on the tiny-random model, trainer), a temporary local store.
Runs one TrainingRunWorkflow of `--steps` steps (native scenario episodes, `--tasks` x `--group`
per step, continue-as-new every `--every` steps), then reads every history through the Temporal client:

- per run of the TrainingRunWorkflow: steps, events, bytes, bytes per step, and the size of the
  carried RunState (its start input, which grows with the StepRecords of the steps before it);
- per episode workflow: events and bytes (min / mean / max).

    .venv/bin/python bench/bench_run_history.py                # 6 steps, continue-as-new every 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.worker import run_worker  # noqa: E402
from grove import queues  # noqa: E402
from grove.client import connect, workflow_runs  # noqa: E402
from grove.contracts import HarnessSpec, RunConfig, RunResult, RunState  # noqa: E402
from grove.learner_config import LearnerConfig  # noqa: E402
from grove.sampling import SamplingConfig  # noqa: E402
from harnesses import scenario  # noqa: E402
from infra.temporal import TemporalDevServer  # noqa: E402
from models.registry import ensure_model  # noqa: E402
from storage.local import LocalStore  # noqa: E402
from workflows.training_run import TrainingRunWorkflow  # noqa: E402


def size(history) -> int:
    return sum(e.ByteSize() for e in history.events)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-run-"))
    server = TemporalDevServer(tmp / "temporal").start()
    worker = None
    try:
        client = await connect(server.address)
        model = str(ensure_model("tiny-random"))
        worker = asyncio.create_task(
            run_worker(client, list(queues.ALL), store=LocalStore(tmp / "store"), model=model,
                       work_dir=tmp / "worker", device="cpu", engine_config={"max_model_len": 256})
        )  # fmt: skip
        cfg = RunConfig(
            run_id=f"bench-run-{uuid.uuid4().hex[:6]}", model=model, seed=1, steps=args.steps,
            task_family=scenario.NAME, num_tasks=64, tasks_per_step=args.tasks, group_size=args.group,
            harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
            learner=LearnerConfig(lr=1e-3), continue_as_new_every=args.every,
        )  # fmt: skip
        t0 = time.monotonic()
        result = await client.execute_workflow(
            TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
            result_type=RunResult,
        )  # fmt: skip
        print(f"run {cfg.run_id}: {result.steps} steps in {time.monotonic() - t0:.0f} s")
        runs = await workflow_runs(client, cfg.run_id)
        print("run workflow:  run  steps  events      bytes  bytes/step  carried RunState (start input)")
        for k, h in enumerate(runs):
            steps = min(args.every, args.steps - k * args.every)
            carried = h.events[0].workflow_execution_started_event_attributes.input.ByteSize()
            b = size(h)
            print(f"  {k:>14} {steps:>6} {len(h.events):>7} {b:>10} {b / steps:>11.0f} {carried:>10}")
        eps = {
            e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
            for h in runs
            for e in h.events
            if e.HasField("child_workflow_execution_started_event_attributes")
        }
        sizes = []
        for eid in sorted(eps):
            [h] = await workflow_runs(client, eid)
            sizes.append((len(h.events), size(h)))
        ev, by = [s[0] for s in sizes], [s[1] for s in sizes]
        print(
            f"episodes: {len(sizes)}; events min/mean/max {min(ev)}/{statistics.mean(ev):.0f}/{max(ev)}; "
            f"bytes min/mean/max {min(by)}/{statistics.mean(by):.0f}/{max(by)}"
        )
    finally:
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker
        server.stop()


if __name__ == "__main__":
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=3, help="continue_as_new_every")
    parser.add_argument("--tasks", type=int, default=1, help="tasks_per_step")
    parser.add_argument("--group", type=int, default=4, help="group_size")
    asyncio.run(main(parser.parse_args()))
