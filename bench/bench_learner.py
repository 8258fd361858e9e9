"""Benchmark: learner layouts side by side, and the learner vs a plain Hugging Face forward+backward.

Layouts (default section): one `Learner.step` per layout on the same episodes, printed side by side:

- padded rows: the forest rows, right-padded (the learner before issue 14);
- packed rows: the same rows end to end, no padding;
- tree: each episode's rows as a token trie, every distinct prefix forwarded once;
- per-call rows: each eligible call as its own prompt+completion row (what a per-sample trainer
  forwards), padded;

against the episodes' unique tokens (distinct (episode, prefix) tokens). Scenarios:
(a) one delegation-demo step: 2 tasks x 8 episodes of harnesses/delegation.py's call structure with
the real chat template (parent delegates, 2 workers, parent answers; completions <= 8 tokens);
(b) a long multi-agent episode (tests/learner/forests.py `long_prefix_episode`): parent context of
`--parent-tokens`, 8 workers forked from it adding half that each, 2 compactions.
Times are process CPU seconds of one step (median of `--reps`; CPU time is the fairer measure on a
shared machine); "unique tok/s" = unique tokens / step time, the same numerator for every layout,
so its ratios are speed ratios.

`--memory`: peak memory of one packed step vs row length, with and without activation checkpointing
(each length in a fresh subprocess; peak RSS of the second step over the RSS before it, Linux
/proc/self/clear_refs resets the high-water mark in between).

`--ranks N`: the learner on 1 process vs N gloo ranks (trainer/distributed.py, FSDP2, each rank
`--threads` threads) on the same (a) and (b) batches, side by side: step wall seconds (median of
`--reps` after a warm-up, barrier before and after on the ranks), forwarded tokens/s in total and per
rank, and the loss (the same up to float32 summation order). Each engine runs in fresh processes.

`--hf`: the learner (padded) vs HF `model(input_ids, labels=input_ids).loss.backward()` + the same
AdamW step over the same padded tensors (goal ratio >= 0.95). On CUDA also an MFU estimate.

    .venv/bin/python bench/bench_learner.py [--model tiny-random] [--parent-tokens 4096] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grove.learner_config import LearnerConfig  # noqa: E402
from models.registry import ensure_model  # noqa: E402
from tests.learner.forests import (  # noqa: E402
    Episode,
    delegation_batch,
    long_prefix_episode,
    random_episode,
    rows_from_calls,
)
from trainer.learner import Learner, prepare_batch  # noqa: E402
from trainer.packing import unique_prefix_tokens  # noqa: E402
from trainer.rows import Row, Span  # noqa: E402

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def per_call_rows(episodes: list[Episode]) -> list[Row]:
    """Each eligible call alone: its prompt + completion, loss on its completion."""
    rows = []
    for ep in episodes:
        for c in ep.calls:
            if not c.eligible:
                continue
            ids = np.concatenate([c.prompt, c.completion]).astype(np.int32)
            p, n = c.prompt.size, c.completion.size
            mask = np.zeros(ids.size, bool)
            mask[p:] = True
            blp = np.zeros(ids.size, np.float32)
            blp[p:] = c.logprobs
            span = Span(c.call_id, c.agent, p, p + n, True, True, 0, c.temperature, c.top_p)
            rows.append(Row(f"{ep.episode_id}#{c.call_id}", ep.episode_id, ep.group_id, ids, mask, blp,
                            (span,), ep.reward))  # fmt: skip
    return rows


def cpu_timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


LAYOUT_LABELS = {
    "padded": "padded rows",
    "packed": "packed rows",
    "tree": "tree",
    "per-call": "per-call rows",
}


def run_layouts(
    name: str, episodes: list[Episode], model_dir: Path, reps: int, budget: int, only: list[str]
) -> None:
    rows = [r for ep in episodes for r in rows_from_calls(ep)]
    unique = unique_prefix_tokens(rows)
    variants = {
        "padded rows": (rows, "padded"),
        "packed rows": (rows, "packed"),
        "tree": (rows, "tree"),
        "per-call rows": (per_call_rows(episodes), "padded"),
    }
    variants = {label: v for label, v in variants.items() if label in {LAYOUT_LABELS[k] for k in only}}
    print(f"\n({name}) {len(episodes)} episodes, {len(rows)} rows, {sum(len(r.input_ids) for r in rows)} row "
          f"tokens, {unique} unique tokens, micro_batch_tokens {budget}")  # fmt: skip
    head = f"{'layout':14s} {'forwarded':>9s} {'padded':>8s} {'fwd/uniq':>8s} {'mbs':>4s} {'cpu s':>8s}"
    print(head + f" {'wall s':>7s} {'fwd tok/s':>10s} {'uniq tok/s':>10s} {'speed':>6s} {'loss':>10s}")
    learners = {
        label: Learner(
            model_dir, LearnerConfig(lr=1e-6, layout=layout, micro_batch_tokens=budget), device="cpu"
        )
        for label, (_, layout) in variants.items()
    }
    samples: dict[str, list] = {label: [] for label in variants}
    for rep in range(reps + (reps > 1)):  # interleaved, so drift in machine load hits all alike
        for label, (vrows, _) in variants.items():
            sample = cpu_timed(lambda learner=learners[label], vrows=vrows: learner.step(vrows))
            if rep or reps == 1:  # the first of several is a warm-up (allocator, optimizer state)
                samples[label].append(sample)
    base = None
    for label in variants:
        wall = statistics.median(s[0] for s in samples[label])
        cpu = statistics.median(s[1] for s in samples[label])
        m = samples[label][0][2]
        base = base or cpu
        print(f"{label:14s} {m.forwarded_tokens:9d} {m.padded_tokens:8d} {m.forwarded_tokens / unique:8.2f} "
              f"{m.micro_batches:4d} {cpu:8.2f} {wall:7.2f} {m.forwarded_tokens / cpu:10.0f} "
              f"{unique / cpu:10.0f} {base / cpu:5.2f}x {m.loss:10.6f}", flush=True)  # fmt: skip


def memory_probe(model_dir: Path, length: int, checkpointing: bool) -> dict:
    """One packed step on one row of `length` tokens; peak RSS growth over the loaded learner."""
    rng = np.random.default_rng(0)
    ep = random_episode(rng, "m", "g", 1.0, vocab=256, size=0, scale=1)
    c = ep.calls[0]
    prompt = rng.integers(3, 256, size=length - c.completion.size).astype(np.int32)
    ep.calls[0] = type(c)(**{**c.__dict__, "prompt": prompt})
    rows = rows_from_calls(ep)
    cfg = LearnerConfig(lr=1e-6, layout="packed", micro_batch_tokens=10**7,
                        activation_checkpointing=checkpointing)  # fmt: skip
    learner = Learner(model_dir, cfg, device="cpu")
    learner.step(rows)  # optimizer state allocated, allocator warm
    loaded = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
    learner.step(rows)
    peak = _status_kb("VmHWM")
    return {"length": length, "checkpointing": checkpointing, "peak_mb": peak / 1024,
            "step_mb": (peak - loaded) / 1024}  # fmt: skip


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def run_memory(model: str, lengths: list[int]) -> None:
    print("\npeak RSS of one packed step vs row length (fresh process per point, MiB; step = peak - loaded)")
    print(f"{'tokens':>7s} {'peak':>8s} {'step':>8s} {'ckpt peak':>10s} {'ckpt step':>10s}")
    for n in lengths:
        peaks = []
        for ck in (False, True):
            out = subprocess.run([sys.executable, __file__, "--model", model, "--memory-probe", str(n)]
                                 + (["--checkpointing"] if ck else []),
                                 capture_output=True, text=True, check=True)  # fmt: skip
            peaks.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{n:7d} {peaks[0]['peak_mb']:8.0f} {peaks[0]['step_mb']:8.0f} {peaks[1]['peak_mb']:10.0f} "
              f"{peaks[1]['step_mb']:10.0f}", flush=True)  # fmt: skip


def scenario_rows(model_dir: Path, name: str, parent_tokens: int) -> list[Row]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    if name == "a":
        episodes = delegation_batch(tok)
    else:
        rng = np.random.default_rng(0)
        half = parent_tokens // 2
        episodes = [
            long_prefix_episode(
                rng, "long", "g", 1.0, vocab=len(tok), parent_tokens=parent_tokens, worker_tokens=half
            )
        ]
    return [r for ep in episodes for r in rows_from_calls(ep)]


def rank_probe(model_dir: Path, scenario: str, cfg: LearnerConfig, reps: int, parent_tokens: int) -> None:
    """One engine's step times on a scenario: the single-process Learner, or (under torchrun) one rank
    of the DistributedLearner; rank 0 prints one JSON line."""
    import torch.distributed as dist

    rows = scenario_rows(model_dir, scenario, parent_tokens)
    ranked = "WORLD_SIZE" in os.environ
    if ranked:
        from trainer.distributed import DistributedLearner

        dist.init_process_group("gloo")
        learner = DistributedLearner(model_dir, cfg, device="cpu")
    else:
        learner = Learner(model_dir, cfg, device="cpu")
    sync = dist.barrier if ranked else (lambda: None)
    times, metrics = [], None
    for rep in range(reps + 1):
        sync()
        t = time.perf_counter()
        m = learner.step(rows)
        sync()
        if rep:  # the first is a warm-up
            times.append(time.perf_counter() - t)
        metrics = metrics or m
    world = dist.get_world_size() if ranked else 1
    if not ranked or dist.get_rank() == 0:
        out = {"world": world, "seconds": statistics.median(times), "forwarded": metrics.forwarded_tokens}
        print(json.dumps({**out, "loss": metrics.loss}))
    if ranked:
        dist.destroy_process_group()


def run_ranks(a, ranks: int) -> None:
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
            cmd = [*launch, __file__, *probe, "--rank-probe", scenario]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            base = base or r["seconds"]
            tps = r["forwarded"] / r["seconds"]
            engine = "1 process" if world == 1 else f"{world} ranks"
            row = f"{scenario:9s} {engine:10s} {r['forwarded']:9d} {r['seconds']:8.2f} {tps:8.0f}"
            print(row + f" {tps / world:10.0f} {base / r['seconds']:6.2f}x {r['loss']:12.8f}", flush=True)


def hf_step(model, plan, optimizer, *, with_optimizer: bool, device) -> None:
    for mb in plan:
        ids = mb.input_ids.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    if with_optimizer:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_hf(model_name: str, n_episodes: int, reps: int, device: str) -> None:
    cfg = LearnerConfig(lr=1e-6)
    learner = Learner(ensure_model(model_name), cfg, device=device)
    dev, model = learner.device, learner.model
    rng = np.random.default_rng(0)
    eps = [random_episode(rng, f"ep{j}", "g0", float(j % 3), vocab=model.config.vocab_size, size=8, scale=8)
           for j in range(n_episodes)]  # fmt: skip
    rows = [r for ep in eps for r in rows_from_calls(ep)]
    plan = prepare_batch(rows, cfg).plan
    real = sum(mb.real_tokens for mb in plan)
    runs = {
        "learner": lambda: learner.step(rows),
        "hf+adamw": lambda: hf_step(model, plan, learner.optimizer, with_optimizer=True, device=dev),
    }
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["hf+adamw"] / med["learner"]
    print(f"\nlearner vs HF on {real} real tokens: ratio {ratio:.3f} (goal >= 0.95)")
    if dev.type == "cuda":
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
        flops = 6 * sum(p.numel() for p in model.parameters()) * real / med["learner"]
        print(f"{name}: {flops / 1e12:.1f} TFLOP/s, MFU {flops / peak:.1%}" if peak else name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--parent-tokens", type=int, default=4096, help="(b): parent context; workers add half")
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--reps-long", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--memory", default="", help="comma-separated row lengths for the memory table")
    p.add_argument("--memory-probe", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hf", action="store_true", help="also compare the learner with plain HF")
    p.add_argument("--skip-layouts", action="store_true")
    p.add_argument("--layouts", default=",".join(LAYOUT_LABELS),
                   help="which layouts to time (speed is relative to the first one)")  # fmt: skip
    p.add_argument("--ranks", type=int, default=0, help="also compare 1 process with this many gloo ranks")
    p.add_argument("--ranks-layout", default="packed")
    p.add_argument("--ranks-budget", type=int, default=1024, help="micro-batch tokens of the ranks section")
    p.add_argument("--rank-probe", default="", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir = ensure_model(a.model)
    if a.memory_probe:
        print(json.dumps(memory_probe(model_dir, a.memory_probe, a.checkpointing)))
        return
    if a.rank_probe:
        cfg = LearnerConfig(lr=1e-6, layout=a.ranks_layout, micro_batch_tokens=a.micro_batch_tokens)
        rank_probe(model_dir, a.rank_probe, cfg, a.reps, a.parent_tokens)
        return
    print(f"model {a.model}, threads {torch.get_num_threads()}")
    if not a.skip_layouts:
        tok = AutoTokenizer.from_pretrained(model_dir)
        only = a.layouts.split(",")
        unknown = set(only) - set(LAYOUT_LABELS)
        if unknown:
            p.error(f"--layouts: unknown {sorted(unknown)}; choose from {list(LAYOUT_LABELS)}")
        run_layouts(
            "a: delegation demo step", delegation_batch(tok), model_dir, a.reps, a.micro_batch_tokens, only
        )
        vocab = len(tok)
        half = a.parent_tokens // 2
        long = [long_prefix_episode(np.random.default_rng(0), "long", "g", 1.0, vocab=vocab,
                                    parent_tokens=a.parent_tokens, worker_tokens=half)]  # fmt: skip
        title = f"b: parent {a.parent_tokens}, 8 workers x {half}, 2 compactions"
        run_layouts(title, long, model_dir, a.reps_long, a.micro_batch_tokens, only)
    if a.memory:
        run_memory(a.model, [int(x) for x in a.memory.split(",")])
    if a.ranks:
        run_ranks(a, a.ranks)
    if a.hf:
        run_hf(a.model, 8, a.reps, a.device)


if __name__ == "__main__":
    main()
