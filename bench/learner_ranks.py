"""The `--ranks` section of bench/bench_learner.py: the learner on 1 process vs N gloo ranks (CPU).

trainer/distributed.py (FSDP2), each rank `--threads` threads, on the same (a) and (b) batches, side
by side: step wall seconds (median of `--reps` after a warm-up, barrier before and after on the
ranks), forwarded tokens/s in total and per rank, and the loss (the same up to float32 summation
order). Each engine runs in fresh processes: the benchmark script itself with `--rank-probe`, under
torchrun for N ranks.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from grove.learner_config import LearnerConfig
from models.registry import ensure_model
from trainer.learner import Learner, StepMetrics

BENCH = Path(__file__).with_name("bench_learner.py")


def rank_probe(a, scenario_rows: Callable) -> None:
    """One engine's step times on scenario `a.rank_probe`: the single-process Learner, or (under
    torchrun) one rank of the DistributedLearner; rank 0 prints one JSON line."""
    import torch.distributed as dist

    model_dir = ensure_model(a.model)
    cfg = LearnerConfig(lr=1e-6, layout=a.ranks_layout, micro_batch_tokens=a.micro_batch_tokens)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rows = scenario_rows(model_dir, a.rank_probe, a.parent_tokens, vocab)
    ranked = "WORLD_SIZE" in os.environ
    learner: Learner
    if ranked:
        from trainer.distributed import DistributedLearner

        dist.init_process_group("gloo")
        learner = DistributedLearner(model_dir, cfg, device="cpu")
    else:
        learner = Learner(model_dir, cfg, device="cpu")
    sync = dist.barrier if ranked else (lambda: None)
    times: list[float] = []
    metrics: StepMetrics | None = None
    for rep in range(a.reps + 1):
        sync()
        t = time.perf_counter()
        m = learner.step(rows)
        sync()
        if rep:  # the first is a warm-up
            times.append(time.perf_counter() - t)
        metrics = metrics or m
    world = dist.get_world_size() if ranked else 1
    if metrics is None:
        raise ValueError(f"no step ran: --reps is {a.reps}")
    if not ranked or dist.get_rank() == 0:
        out = {"world": world, "seconds": statistics.median(times), "forwarded": metrics.forwarded_tokens}
        print(json.dumps({**out, "loss": metrics.loss}))
    if ranked:
        dist.destroy_process_group()


def run_ranks(a) -> None:
    ranks = a.ranks
    print(
        f"\n1 process vs {ranks} gloo ranks (FSDP2), layout {a.ranks_layout}, micro-batch {a.ranks_budget} "
        f"tokens, {a.threads} thread(s) per process, wall s per step (median of {a.reps}); "
        f"{os.cpu_count()} cores on this machine"
    )
    head = (
        f"{'scenario':9s} {'engine':10s} {'forwarded':>9s} {'wall s':>8s} {'tok/s':>8s} {'tok/s/rank':>10s}"
    )
    print(head + f" {'speedup':>7s} {'loss':>12s}")
    probe = ["--model", a.model, "--threads", str(a.threads), "--reps", str(a.reps)]
    probe += ["--ranks-layout", a.ranks_layout, "--micro-batch-tokens", str(a.ranks_budget)]
    probe += ["--parent-tokens", str(a.parent_tokens)]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node"]
    for scenario in ("a", "b"):
        base = None
        for world in (1, ranks):
            launch = [sys.executable] if world == 1 else [*torchrun, str(world)]
            cmd = [*launch, str(BENCH), *probe, "--rank-probe", scenario]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            base = base or r["seconds"]
            tps = r["forwarded"] / r["seconds"]
            engine = "1 process" if world == 1 else f"{world} ranks"
            row = f"{scenario:9s} {engine:10s} {r['forwarded']:9d} {r['seconds']:8.2f} {tps:8.0f}"
            print(row + f" {tps / world:10.0f} {base / r['seconds']:6.2f}x {r['loss']:12.8f}", flush=True)
