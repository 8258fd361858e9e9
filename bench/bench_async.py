"""Benchmark: synchronous vs asynchronous GRPO (max_policy_lag k = 0, 1, 2) at 1 and 2 inference engines.

Each invocation runs one section on its own stack (Temporal dev server, local object store, `grove
worker` processes: `main` for the episodes and io queues, `trainer`, one or two inference workers with
a vLLM engine each) and prints that section's table, its rows side by side:

`runs` trains the same run (delegation task family, tiny model) once per (engines, k), first with engine
e1 alone, then with e2 added:
- steps/min and trained tokens/min (loss tokens of the steps over the run's wall time), with their
  ratio to k = 0 at the same engine count;
- idle fraction of the learner (1 - train_step seconds / wall) and of each engine (1 - seconds with
  a generation in flight / wall, from their own reports: activities/engine_status.py);
- the policy lag of the trained tokens (tokens per lag value, from the learner's metrics);
- the mean reward of each step (and of the first and last third of the steps), and for k > 0 how far
  off-policy the stale tokens were (mean truncated IS weight, fraction capped: trainer/loss.py).

`summary` puts the rows of several `runs` invocations side by side (each `runs --out FILE` appends its
rows, with their seed, to FILE): per seed and k the mean reward of the first and last third of the
steps, then per k the mean and spread over the seeds, and the per-seed difference of each k to k = 0
(the same seed runs the same task order at every k, so the difference is paired).

`orchestration` runs one-token delegation episodes (every call generates exactly one token) straight
on the episodes queue, at several numbers in flight, with 1 then 2 engines: episodes/s, calls/s and
the CPU each process used (the `main` worker, the dev server, each engine), to see what saturates.

    .venv/bin/python bench/bench_async.py runs [--steps 4] [--tasks 1] [--group 4] [--lags 0,1,2]
        [--engines 1,2] [--seed 0] [--tag NAME] [--out rows.jsonl]
    .venv/bin/python bench/bench_async.py summary rows.jsonl [more.jsonl ...]
    .venv/bin/python bench/bench_async.py orchestration [--engines 1,2] [--concurrency 1,4,16,32]

Every row prints the load average (1/5/15 min) at its start and end: on a shared machine the numbers
are only comparable within a section. Every run of a section shares the stack (so engines switch run
lineage between rows: that load is part of the row's first step, as it is for any engine joining a
run). Everything started is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil

from activities.engine_status import read_statuses
from grove import queues
from grove.client import connect
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec, PolicyRef, RunConfig, RunResult, RunState
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from harnesses import delegation
from infra.temporal import TemporalDevServer
from infra.worker_process import WorkerProcess
from models.registry import ensure_model
from storage.local import LocalStore
from workflows.episode import EpisodeWorkflow


def run_config(args: argparse.Namespace, engines: int, k: int) -> RunConfig:
    return RunConfig(
        run_id=f"bench-{args.tag}e{engines}-k{k}", model=args.model, seed=args.seed, steps=args.steps,
        task_family="delegation", tasks_per_step=args.tasks, group_size=args.group,
        harness=HarnessSpec(program="delegation"),
        sampling=SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature),
        max_policy_lag=k, continue_as_new_every=1000,
        learner=LearnerConfig(lr=args.lr, weight_decay=0.0),
    )  # fmt: skip


def busy(store: LocalStore) -> dict[str, float]:
    return {s.engine_id: s.busy_s for s in read_statuses(store, queues.INFERENCE)}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def one_run(client, store: LocalStore, cfg: RunConfig) -> dict:
    before = busy(store)
    load0 = load()
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
    stale = [h.metrics.get("stale_tokens", 0.0) for h in hist]
    lags: dict[int, float] = {}
    for h in hist:
        for key, v in h.metrics.items():
            if key.startswith("lag_tokens_"):
                lag = int(key.rsplit("_", 1)[1])
                lags[lag] = lags.get(lag, 0.0) + v
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
        "reward_std": [round(h.rollout.get("reward_std", 0.0), 3) for h in hist],
        # over the run's stale tokens: mean truncated IS weight, fraction capped (None: no stale token)
        "is_weight_mean": _stale_mean(hist, stale, "is_weight_mean"),
        "is_truncated_frac": _stale_mean(hist, stale, "is_truncated_frac"),
        "load": f"{load0} -> {load()}",
    }


def _stale_mean(hist, stale: list[float], key: str) -> float | None:
    """Mean of a per-step stale-token metric over the run, each step weighted by its stale tokens."""
    total = sum(stale)
    if not total:
        return None
    return round(sum(h.metrics.get(key, 0.0) * n for h, n in zip(hist, stale, strict=True)) / total, 4)


def table(rows: list[dict]) -> str:
    base = {r["engines"]: r for r in rows if r["k"] == 0}
    head = f"{'engines':>7} {'k':>2} {'wall s':>7} {'steps/min':>9} {'x k=0':>6} {'tok/min':>8} {'x k=0':>6} "
    head += f"{'learner idle':>12} {'engine idle':>11}  {'lag: trained tokens':<20} "
    head += f"{'load 1/5/15 start -> end':<30}"
    out = [head]
    for r in rows:
        b = base.get(r["engines"])
        rs = r["steps_per_min"] / b["steps_per_min"] if b else float("nan")
        rt = r["tokens_per_min"] / b["tokens_per_min"] if b and b["tokens_per_min"] else float("nan")
        idle = "/".join(f"{v:.2f}" for v in r["engine_idle"].values()) or "-"
        lag = " ".join(f"{k}:{int(v)}" for k, v in r["lag_tokens"].items())
        out.append(
            f"{r['engines']:>7} {r['k']:>2} {r['wall_s']:>7.1f} {r['steps_per_min']:>9.2f} {rs:>6.2f} "
            f"{r['tokens_per_min']:>8.0f} {rt:>6.2f} {r['learner_idle']:>12.2f} {idle:>11}  {lag:<20} "
            f"{r['load']:<30}"
        )
    out.append("")
    out.append(f"{'engines':>7} {'k':>2}  first third  last third  IS w / capped  mean reward per step")
    for r in rows:
        first, last = thirds(r["reward"])
        out.append(
            f"{r['engines']:>7} {r['k']:>2}  {first:>11.3f} {last:>11.3f}  {is_cell(r):>13}  "
            f"{' '.join(f'{x:.2f}' for x in r['reward'])}"
        )
    return "\n".join(out)


def thirds(rewards: list[float]) -> tuple[float, float]:
    """Mean reward of the first and of the last third of the steps (at least one step each)."""
    n = max(1, len(rewards) // 3)
    return sum(rewards[:n]) / n, sum(rewards[-n:]) / n


def is_cell(row: dict) -> str:
    """`mean IS weight / fraction capped` of a row's stale tokens; '-' without any (or not recorded)."""
    if row.get("is_weight_mean") is None:
        return "-"
    return f"{row['is_weight_mean']:.2f} / {row['is_truncated_frac']:.2f}"


# -------------------------------------------------------------------------------------------- summary


def mean_sd(xs: list[float]) -> str:
    """`mean ± sample standard deviation` (± - for a single value)."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return f"{m:.3f} ± -"
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return f"{m:.3f} ± {sd:.3f}"


def read_rows(paths: list[Path]) -> list[dict]:
    """The run rows of `runs --out` files (one JSON object a line; other lines are skipped, so a
    captured stdout of `runs` whose rows were given a `seed` works too)."""
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                if "reward" in row and "seed" in row:
                    rows.append(row)
    return rows


def summary_table(rows: list[dict]) -> str:
    """Per (engines, seed, k): first/last third of the mean reward; per (engines, k): mean ± sd over the
    seeds of both and of the gain, and of the paired difference to k = 0 of the same seed."""
    by = {(r["engines"], r["seed"], r["k"]): r for r in rows}
    out = [f"{'engines':>7} {'seed':>4} {'k':>2}  first third  last third    gain  IS w / capped  wall s"]
    for key in sorted(by):
        r = by[key]
        first, last = thirds(r["reward"])
        out.append(
            f"{key[0]:>7} {key[1]:>4} {key[2]:>2}  {first:>11.3f} {last:>11.3f}  {last - first:>6.3f}  "
            f"{is_cell(r):>13}  {r['wall_s']:>6.1f}"
        )
    out.append("")
    head = f"{'engines':>7} {'k':>2} {'seeds':>5}  {'first third':>15}  {'last third':>15}  {'gain':>15}  "
    out.append(head + "last third - k=0's (paired)")
    for engines, k in sorted({(e, k) for e, _, k in by}):
        seeds = sorted(s for e, s, kk in by if (e, kk) == (engines, k))
        firsts, lasts = zip(*(thirds(by[engines, s, k]["reward"]) for s in seeds), strict=True)
        gains = [b - a for a, b in zip(firsts, lasts, strict=True)]
        paired = [
            thirds(by[engines, s, k]["reward"])[1] - thirds(by[engines, s, 0]["reward"])[1]
            for s in seeds
            if (engines, s, 0) in by
        ]
        diff = mean_sd(paired) + f" (n={len(paired)})" if k and paired else "-"
        out.append(
            f"{engines:>7} {k:>2} {len(seeds):>5}  {mean_sd(list(firsts)):>15}  {mean_sd(list(lasts)):>15}  "
            f"{mean_sd(gains):>15}  {diff}"
        )
    return "\n".join(out)


# ------------------------------------------------------------------------------------- orchestration


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and all its descendants (0 when it is gone)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def one_token_spec(run_id: str, i: int) -> EpisodeSpec:
    """A delegation episode whose every call generates one token (the native program makes its calls
    whatever the model says: parent, two workers, the parent's answer). Without `ignore_eos`, as the
    figures in docs/results.md were measured (with it a sampled end-of-text token is stripped from the
    completion's text: tests/inference/test_ignore_eos.py)."""
    group = f"{run_id}/t{i}"
    return EpisodeSpec(
        run_id=run_id, step=0, group_id=group, episode_id=f"{group}/g0", task=delegation.make_task(i),
        harness=HarnessSpec(program="delegation"),
        sampling=SamplingConfig(max_tokens=1),
        policy=PolicyRef(run_id=run_id, min_version=0, base_model="tiny"),
    )  # fmt: skip


async def orchestration_level(client, tag: str, n: int, concurrency: int, pids: dict[str, int]) -> dict:
    """`n` one-token episodes, at most `concurrency` in flight: episodes/s, calls/s and the CPU each
    process used over the window (1.0 = one core busy)."""
    run_id = f"bench-orch-{tag}-c{concurrency}"
    sem = asyncio.Semaphore(concurrency)
    calls = failed = 0

    async def one(i: int) -> None:
        nonlocal calls, failed
        async with sem:
            spec = one_token_spec(run_id, i)
            res = await client.execute_workflow(
                EpisodeWorkflow.run, spec, id=spec.episode_id, task_queue=queues.EPISODES,
                result_type=EpisodeResult,
            )  # fmt: skip
            calls += sum(res.counts.values())
            failed += res.status != "ok"

    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    load0 = load()
    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - t0
    cpu = {name: (cpu_seconds(pid) - cpu0[name]) / wall for name, pid in pids.items()}
    return {
        "concurrency": concurrency, "episodes": n, "failed": failed, "wall_s": wall,
        "episodes_per_s": n / wall, "calls_per_s": calls / wall, "cpu": cpu, "load": f"{load0} -> {load()}",
    }  # fmt: skip


def orchestration_table(rows: list[dict]) -> str:
    names = sorted({n for r in rows for n in r["cpu"]}, key=lambda n: (n != "main", n != "server", n))
    head = f"{'engines':>7} {'in flight':>9} {'episodes':>8} {'failed':>6} {'wall s':>7} {'episodes/s':>10} "
    head += f"{'calls/s':>8}  "
    head += " ".join(f"{'cpu ' + n:>10}" for n in names) + f"  {'load 1/5/15 start -> end':<30}"
    out = [head]
    for r in rows:
        cpu = " ".join(f"{r['cpu'][n]:>10.2f}" if n in r["cpu"] else f"{'-':>10}" for n in names)
        out.append(
            f"{r['engines']:>7} {r['concurrency']:>9} {r['episodes']:>8} {r.get('failed', 0):>6} "
            f"{r['wall_s']:>7.1f} {r['episodes_per_s']:>10.2f} {r['calls_per_s']:>8.2f}  {cpu}  "
            f"{r['load']:<30}"
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
            name, names, address=server.address, store_url=store_dir.as_uri(), model=model,
            log_dir=root / "logs",
        )  # fmt: skip

    workers = [worker("main", [queues.EPISODES, queues.IO]), worker("e1", [queues.INFERENCE])]
    if args.section == "runs":
        workers.insert(1, worker("trainer", [queues.TRAINER]))
    print(f"stack under {root}; load {load()} (1/5/15 min) on {os.cpu_count()} cores", flush=True)
    try:
        client = await connect(server.address)
        for w in workers:
            w.start()
        for w in workers:
            await w.wait_ready(client, timeout=600)
        if args.section == "runs":
            await runs_section(args, client, store, workers, worker)
        else:
            await orchestration_section(args, client, workers, worker, server)
    finally:
        for w in workers:
            w.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


async def guarded(coro) -> None:
    """Run `coro`, cancelling it on SIGTERM (e.g. `timeout`), so its `finally` stops every process."""
    task = asyncio.ensure_future(coro)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await task


async def runs_section(args, client, store, workers, worker) -> None:
    rows = []
    for n in args.engines:
        while len(workers) - 2 < n:  # add engines
            w = worker(f"e{len(workers) - 1}", [queues.INFERENCE]).start()
            workers.append(w)
            await w.wait_ready(client, timeout=600)
        for k in args.lags:
            row = await one_run(client, store, run_config(args, n, k))
            row |= {"engines": n, "seed": args.seed, "steps": args.steps, "rollouts": rollouts(args)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    print()
    print(
        f"delegation, model {args.model}, {args.steps} steps x {args.tasks} task(s) x group {args.group}, "
        f"max_tokens {args.max_tokens}, T {args.temperature}, lr {args.lr}, seed {args.seed}; "
        "x k=0: ratio to k=0 at the same engine count; engine idle per engine"
    )
    print(table(rows))


def rollouts(args: argparse.Namespace) -> int:
    """Episodes a run trains on: steps x tasks x group."""
    return args.steps * args.tasks * args.group


async def orchestration_section(args, client, workers, worker, server) -> None:
    pids = {"main": workers[0].pid, "server": server.proc.pid}
    rows = []
    for n in args.engines:
        while len(workers) - 1 < n:  # add engines
            w = worker(f"e{len(workers)}", [queues.INFERENCE]).start()
            workers.append(w)
            await w.wait_ready(client, timeout=600)
        engines = {w.name: w.pid for w in workers[1:]}
        # every engine loads the lineage once, outside the measured levels
        await orchestration_level(client, f"warm{n}", 2 * n, 2 * n, pids | engines)
        for c in args.concurrency:
            row = await orchestration_level(client, f"e{n}", max(args.episodes, 2 * c), c, pids | engines)
            row["engines"] = n
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "one-token delegation episodes (4 calls each: parent, two workers, parent), one `main` worker "
        f"(episodes, io), 1..{max(args.engines)} engines; cpu: CPU seconds per wall second of each "
        f"process with its children, 1.0 = one core ({os.cpu_count()} cores)"
    )
    print(orchestration_table(rows))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=["runs", "orchestration", "summary"], nargs="?", default="runs")
    p.add_argument("files", nargs="*", type=Path, help="summary: `runs --out` files")
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tag", default="", help="prefix of the run ids (runs of one stack must differ)")
    p.add_argument("--lags", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--engines", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument(
        "--episodes", type=int, default=40, help="orchestration: episodes per level (at least 2x in flight)"
    )
    p.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64],
        help="orchestration: episodes in flight per level",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the stack's folder (logs) afterwards")
    p.add_argument("--out", type=Path, help="runs: append each row (a JSON line, with its seed) to this file")
    parsed = p.parse_args()
    if parsed.section == "summary":
        print(summary_table(read_rows(parsed.files)))
    else:
        asyncio.run(guarded(main(parsed)))
