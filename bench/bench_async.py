"""Benchmark: synchronous vs asynchronous GRPO (max_policy_lag k = 0, 1, 2) at 1 and 2 inference engines.

One benchmark run starts its own stack (Temporal dev server, local object store, `grove worker`
processes: `main` for the episodes and io queues, `trainer`, and one or two inference workers with a
vLLM engine each), then trains the same short run (the delegation task family, the tiny model) once
per (engines, k), first with engine e1 alone, then with e2 added, and prints side by side:

- steps/min and trained tokens/min (loss tokens of the steps over the run's wall time);
- idle fraction of the learner (1 - train_step seconds / wall) and of the engines (1 - seconds with
  a generation in flight / wall, from their own reports: activities/engine_status.py);
- the policy lag of the trained tokens (tokens per lag value, from the learner's metrics);
- the mean reward of each step.

    .venv/bin/python bench/bench_async.py [--steps 4] [--tasks 1] [--group 4] [--lags 0,1,2] [--engines 1,2]

Every run of a row shares the stack (so engines switch run lineage between rows: that load is part of
the row's first step, as it is for any engine joining a run). Everything started is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

from activities.engine_status import read_statuses
from grove import queues
from grove.client import connect
from grove.contracts import RunConfig, RunResult, RunState
from grove.learner_config import LearnerConfig
from infra.temporal import TemporalDevServer
from models.registry import ensure_model
from storage.local import LocalStore
from tests.durability.helpers import WorkerProcess


def run_config(args: argparse.Namespace, engines: int, k: int) -> RunConfig:
    return RunConfig(
        run_id=f"bench-e{engines}-k{k}", model=args.model, seed=args.seed, steps=args.steps,
        tasks_per_step=args.tasks, group_size=args.group, max_policy_lag=k, continue_as_new_every=1000,
        learner=LearnerConfig(lr=args.lr),
    )  # fmt: skip


def busy(store: LocalStore) -> dict[str, float]:
    return {s.engine_id: s.busy_s for s in read_statuses(store, queues.INFERENCE)}


async def one_run(client, store: LocalStore, cfg: RunConfig) -> dict:
    before = busy(store)
    t0 = time.monotonic()
    handle = await client.start_workflow(
        "TrainingRunWorkflow", RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip
    result = await handle.result()
    wall = time.monotonic() - t0
    await asyncio.sleep(1.5)  # one more status report from each engine (they write every second)
    after = busy(store)
    engine_busy = {e: after[e] - before.get(e, 0.0) for e in after}
    hist = result.history
    lags: dict[int, float] = {}
    for h in hist:
        for key, v in h.metrics.items():
            if key.startswith("lag_tokens_"):
                lags[int(key.rsplit("_", 1)[1])] = lags.get(int(key.rsplit("_", 1)[1]), 0.0) + v
    train_s = sum(h.timings.get("train_s", 0.0) for h in hist)
    tokens = sum(h.metrics.get("loss_tokens", 0.0) for h in hist)
    return {
        "run": cfg.run_id,
        "k": cfg.max_policy_lag,
        "wall_s": wall,
        "steps_per_min": len(hist) / wall * 60,
        "tokens_per_min": tokens / wall * 60,
        "learner_idle": 1 - train_s / wall,
        "engine_idle": {e: 1 - b / wall for e, b in sorted(engine_busy.items())},
        "lag_tokens": dict(sorted(lags.items())),
        "reward": [round(h.mean_reward, 3) for h in hist],
    }


def table(rows: list[dict]) -> str:
    base = {r["engines"]: r for r in rows if r["k"] == 0}
    head = f"{'engines':>7} {'k':>2} {'wall s':>7} {'steps/min':>9} {'x k=0':>6} {'tok/min':>8} {'x k=0':>6} "
    head += f"{'learner idle':>12} {'engine idle':>14}  lag of trained tokens   reward per step"
    out = [head]
    for r in rows:
        b = base.get(r["engines"])
        rs = r["steps_per_min"] / b["steps_per_min"] if b else float("nan")
        rt = r["tokens_per_min"] / b["tokens_per_min"] if b and b["tokens_per_min"] else float("nan")
        idle = "/".join(f"{v:.2f}" for v in r["engine_idle"].values()) or "-"
        lag = " ".join(f"{k}:{int(v)}" for k, v in r["lag_tokens"].items())
        out.append(
            f"{r['engines']:>7} {r['k']:>2} {r['wall_s']:>7.1f} {r['steps_per_min']:>9.2f} {rs:>6.2f} "
            f"{r['tokens_per_min']:>8.0f} {rt:>6.2f} {r['learner_idle']:>12.2f} {idle:>14}  {lag:<22} "
            f"{r['reward']}"
        )
    return "\n".join(out)


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="grove-bench-async-"))
    model = ensure_model(args.model)
    server = TemporalDevServer(root / "temporal").start()
    store_dir = root / "store"
    store = LocalStore(store_dir)

    def worker(name: str, names: list[str]) -> WorkerProcess:
        return WorkerProcess(
            name, names, address=server.address, store_dir=store_dir, model=model, log_dir=root / "logs"
        )

    workers = [
        worker("main", [queues.EPISODES, queues.IO]),
        worker("trainer", [queues.TRAINER]),
        worker("e1", [queues.INFERENCE]),
    ]
    rows = []
    try:
        client = await connect(server.address)
        for w in workers:
            w.start()
        for w in workers:
            await w.wait_ready(client, timeout=600)
        for n in args.engines:
            while len(workers) - 2 < n:  # add engines
                w = worker(f"e{len(workers) - 1}", [queues.INFERENCE]).start()
                workers.append(w)
                await w.wait_ready(client, timeout=600)
            for k in args.lags:
                row = await one_run(client, store, run_config(args, n, k))
                row["engines"] = n
                rows.append(row)
                print(json.dumps(row), flush=True)
        print()
        print(
            f"delegation, model {args.model}, {args.steps} steps x {args.tasks} task(s) x group "
            f"{args.group}; "
            "x k=0: ratio to k=0 at the same engine count"
        )
        print(table(rows))
    finally:
        for w in workers:
            w.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lags", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--engines", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--keep", action="store_true", help="keep the stack's folder (logs) afterwards")
    asyncio.run(main(p.parse_args()))
