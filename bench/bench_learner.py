"""Benchmark of the learner, on CPU or CUDA: layouts side by side, memory per token, utilisation, ranks, HF.

Layouts (default section): one `Learner.step` per layout on the same episodes, printed side by side:

- padded rows: the forest rows, right-padded (the baseline layout);
- packed rows: the same rows end to end, no padding;
- tree: each episode's rows as a token trie, every distinct prefix forwarded once;
- per-call rows: each eligible call as its own prompt+completion row (what a per-sample trainer
  forwards), padded;

against the episodes' unique tokens (distinct (episode, prefix) tokens). Scenarios:
(a) one delegation-demo step: 2 tasks x 8 episodes of the delegation family's call structure with
the real chat template (parent delegates, 2 workers, parent answers; completions <= 8 tokens);
(b) a long multi-agent episode (bench/forests.py `long_prefix_episode`): parent context of
`--parent-tokens`, 8 workers forked from it adding half that each, 2 compactions.
Time per step: process CPU seconds on CPU (the fairer measure on a shared machine), wall seconds
with the device synchronised on CUDA; median of `--reps` after a warm-up (always one on CUDA:
FlexAttention compiles there). "uniq tok/s" = unique tokens / step time, the same numerator for
every layout, so its ratios are speed ratios. "peak MiB": on CUDA `torch.cuda.max_memory_allocated`
over the step (weights, AdamW state, gradients, activations: one learner is resident at a time);
on CPU the step's peak RSS over the RSS before it (Linux VmHWM, reset through /proc/self/clear_refs).
On CPU the layouts' learners step in turns (machine load drifts alike); on CUDA one after another.

`--model-shape tiny|qwen3-0.6b`: a random-init model of those dimensions (bench/learner_shapes.py)
instead of `--model`, with the tiny model's tokenizer.

`--agreement 1` (default on CUDA): every layout's loss and gradients on the device against the float32
per-call computation, within the tolerances of docs/learner.md (bench/learner_agreement.py).

`--mfu-tokens N` (default 32768 on CUDA, off on CPU): one packed micro-batch of N tokens (rows of
`--mfu-row` tokens, loss on the last quarter of each): step time and forward+backward time, useful
FLOP/s and MFU against the matmul peak measured in the same run (bench/learner_shapes.py defines them).

`--memory [L1,L2]`: peak memory of one packed step on a row of L tokens (loss on its second half) for
each vocabulary of `--memory-vocabs`, with the chunked LM head, the chunked head plus activation
checkpointing, and whole [tokens, vocab] logits (the unchunked baseline); each point in a fresh
process (CPU: step peak RSS over the RSS before it; CUDA: max_memory_allocated over the allocation
before it). "B/token" = (step peak at L2 - at L1) / (L2 - L1): memory per forwarded token (half of
them scored), which must not grow with the vocabulary (the chunk buffers are a constant).

`--ranks N`: the learner on 1 process vs N gloo ranks (trainer/distributed.py, FSDP2, each rank
`--threads` threads) on the same (a) and (b) batches, CPU only (bench/learner_ranks.py).

`--hf`: the learner (padded) vs HF `model(input_ids, labels=input_ids).loss.backward()` + the same
AdamW step over the same padded tensors (goal ratio >= 0.95).

    python bench/bench_learner.py [--device cuda] [--model-shape qwen3-0.6b] [--parent-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.forests import (  # noqa: E402
    Call,
    Episode,
    delegation_batch,
    long_prefix_episode,
    per_call_rows,
    rows_from_calls,
)
from bench.learner_agreement import run_agreement  # noqa: E402
from bench.learner_shapes import (  # noqa: E402
    build_shape_model,
    hf_model,
    matmul_peak,
    micro_batch_flops,
    parameter_counts,
)
from grove.learner_config import LearnerConfig  # noqa: E402
from models.registry import ensure_model  # noqa: E402
from trainer.learner import Learner, StepMetrics, accumulate_gradients, prepare_batch  # noqa: E402
from trainer.packing import unique_prefix_tokens  # noqa: E402
from trainer.rows import Row  # noqa: E402

LAYOUT_LABELS = {
    "padded": "padded rows",
    "packed": "packed rows",
    "tree": "tree",
    "per-call": "per-call rows",
}


# ---- measuring a step ---------------------------------------------------------------------------------


T = TypeVar("T")


@dataclass(frozen=True)
class Sample(Generic[T]):
    seconds: float  # CPU: process CPU seconds; CUDA: wall seconds, device synchronised
    wall: float
    peak_mb: float  # CUDA: max allocated over the step; CPU: peak RSS over the RSS before it
    out: T  # what the measured function returned


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def measure(fn: Callable[[], T], device: torch.device) -> Sample[T]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t
        return Sample(wall, wall, torch.cuda.max_memory_allocated(device) / 2**20, out)
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Sample(cpu, wall, (_status_kb("VmHWM") - before) / 1024, out)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- layouts ----------------------------------------------------------------------------------------


def run_layouts(
    name: str, episodes: list[Episode], model_dir: Path, a, device: torch.device, reps: int
) -> None:
    rows = [r for ep in episodes for r in rows_from_calls(ep)]
    unique = unique_prefix_tokens(rows)
    variants = {
        "padded rows": (rows, "padded"),
        "packed rows": (rows, "packed"),
        "tree": (rows, "tree"),
        "per-call rows": (per_call_rows(episodes), "padded"),
    }
    only = {LAYOUT_LABELS[k] for k in a.layouts.split(",")}
    variants = {label: v for label, v in variants.items() if label in only}
    budget = a.micro_batch_tokens
    print(f"\n({name}) {len(episodes)} episodes, {len(rows)} rows, {sum(len(r.input_ids) for r in rows)} row "
          f"tokens, {unique} unique tokens, micro_batch_tokens {budget}, {device.type}")  # fmt: skip
    unit = "cpu s" if device.type == "cpu" else "gpu s"
    head = f"{'layout':14s} {'forwarded':>9s} {'padded':>8s} {'fwd/uniq':>8s} {'mbs':>4s} {unit:>8s}"
    head += f" {'wall s':>7s} {'fwd tok/s':>10s} {'uniq tok/s':>10s} {'speed':>6s}"
    print(head + f" {'peak MiB':>9s} {'loss':>10s}")

    def learner(layout: str) -> Learner:
        cfg = LearnerConfig(lr=1e-6, layout=layout, micro_batch_tokens=budget)
        out = Learner(model_dir, cfg, device=device)
        if a.attention:
            out.attention_backend = a.attention
        return out

    warmup = reps > 1 or device.type == "cuda"  # the first step allocates AdamW state, compiles kernels
    samples: dict[str, list[Sample[StepMetrics]]] = {label: [] for label in variants}
    if device.type == "cpu":  # every learner resident, steps interleaved: machine load hits all alike
        learners = {label: learner(layout) for label, (_, layout) in variants.items()}
        for rep in range(reps + warmup):
            for label, (vrows, _) in variants.items():
                sample = measure(partial(learners[label].step, vrows), device)
                if rep or not warmup:
                    samples[label].append(sample)
    else:  # one learner resident at a time: its peak memory is its own
        for label, (vrows, layout) in variants.items():
            one = learner(layout)
            for rep in range(reps + warmup):
                sample = measure(partial(one.step, vrows), device)
                if rep or not warmup:
                    samples[label].append(sample)
            del one
            _release(device)
    base = None
    for label in variants:
        secs = statistics.median(s.seconds for s in samples[label])
        wall = statistics.median(s.wall for s in samples[label])
        peak = max(s.peak_mb for s in samples[label])
        m = samples[label][0].out
        base = base or secs
        print(f"{label:14s} {m.forwarded_tokens:9d} {m.padded_tokens:8d} {m.forwarded_tokens / unique:8.2f} "
              f"{m.micro_batches:4d} {secs:8.3f} {wall:7.3f} {m.forwarded_tokens / secs:10.0f} "
              f"{unique / secs:10.0f} {base / secs:5.2f}x {peak:9.0f} {m.loss:10.6f}",
              flush=True)  # fmt: skip


def scenario_episodes(model_dir: Path, name: str, parent_tokens: int, vocab: int) -> list[Episode]:
    if name == "a":
        return delegation_batch(AutoTokenizer.from_pretrained(model_dir))
    rng = np.random.default_rng(0)
    return [long_prefix_episode(rng, "long", "g", 1.0, vocab=vocab, parent_tokens=parent_tokens,
                                worker_tokens=parent_tokens // 2)]  # fmt: skip


def scenario_rows(model_dir: Path, name: str, parent_tokens: int, vocab: int) -> list[Row]:
    return [r for ep in scenario_episodes(model_dir, name, parent_tokens, vocab) for r in rows_from_calls(ep)]


# ---- utilisation -------------------------------------------------------------------------------------


def single_call_rows(n_rows: int, length: int, completion: int, vocab: int, seed: int = 0) -> list[Row]:
    """`n_rows` one-call episodes of `length` tokens, loss on the last `completion`, one group."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_rows):
        prompt = rng.integers(3, vocab, size=length - completion).astype(np.int32)
        done = rng.integers(3, vocab, size=completion).astype(np.int32)
        lp = -rng.uniform(0.05, 4.0, size=completion).astype(np.float32)
        call = Call("parent/c0/000", "parent", "parent/c0", None, prompt, done, lp)
        rows += rows_from_calls(Episode(f"mfu-{i}", "g", float(i % 4), [call]))
    return rows


def run_mfu(model_dir: Path, a, device: torch.device) -> None:
    length = min(a.mfu_row, a.mfu_tokens)
    n_rows = a.mfu_tokens // length
    learner = Learner(model_dir, LearnerConfig(lr=1e-6, layout="packed", micro_batch_tokens=n_rows * length),
                      device=device)  # fmt: skip
    if a.attention:
        learner.attention_backend = a.attention
    model = hf_model(learner.model)
    config = model.config
    rows = single_call_rows(n_rows, length, length // 4, config.vocab_size)
    batch = prepare_batch(rows, learner.config)
    (mb,) = batch.plan
    tokens, scored, pairs = (
        mb.real_tokens,
        int(mb.loss_positions.numel()),
        n_rows * length * (length + 1) // 2,
    )
    non_embedding, embedding = parameter_counts(model)
    flops = micro_batch_flops(config, non_embedding, tokens, scored, pairs)
    peak, what = matmul_peak(device)

    def fwd_bwd():
        accumulate_gradients(learner.model, batch.plan, batch.denominator, learner.config, device,
                             options=learner._options(guard=None))  # fmt: skip
        learner.optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: AdamW state, compiled kernels, the guard's probe
        learner.step(rows)
        fwd_bwd()
    steps = [measure(lambda: learner.step(rows), device) for _ in range(a.reps)]
    passes = [measure(fwd_bwd, device) for _ in range(a.reps)]
    print(f"\nutilisation: one packed micro-batch of {tokens} tokens ({n_rows} rows x {length}, {scored} "
          f"scored, {pairs / 1e6:.1f}M attention pairs), {non_embedding / 1e6:.1f}M non-embedding + "
          f"{embedding / 1e6:.1f}M embedding parameters; useful {flops / 1e12:.3f} TFLOP; peak "
          f"{peak / 1e12:.2f} TFLOP/s ({what}, measured)")  # fmt: skip
    print(f"{'what':18s} {'seconds':>8s} {'TFLOP/s':>8s} {'MFU':>6s} {'tok/s':>9s} {'peak MiB':>9s}")
    for label, got in (("learner step", steps), ("forward+backward", passes)):
        secs = statistics.median(s.seconds for s in got)
        rate = flops / secs
        print(f"{label:18s} {secs:8.3f} {rate / 1e12:8.2f} {rate / peak:6.1%} {tokens / secs:9.0f} "
              f"{max(s.peak_mb for s in got):9.0f}", flush=True)  # fmt: skip


# ---- memory per token vs vocabulary --------------------------------------------------------------------

MEMORY_HEADS = {"chunked": {}, "chunked+ckpt": {"checkpointing": True}, "full logits": {"full_logits": True}}


def memory_probe(a, device: torch.device) -> dict:
    """One packed step on one row of `--memory-probe` tokens (loss on its second half), after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="grove-bench-vocab-") as tmp:
        model_dir = build_shape_model("tiny", ensure_model("tiny-random"), Path(tmp), vocab=a.memory_vocab)
        cfg = LearnerConfig(lr=1e-6, layout="packed", micro_batch_tokens=10**7,
                            activation_checkpointing=a.checkpointing)  # fmt: skip
        learner = Learner(model_dir, cfg, device=device)
        learner.full_logits = a.full_logits
        n = a.memory_probe
        rows = single_call_rows(1, n, n // 2, a.memory_vocab)
        learner.step(rows)
        _release(device)
        base = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        sample = measure(lambda: learner.step(rows), device)
    return {"length": n, "scored": n // 2, "step_mb": sample.peak_mb - base}


def run_memory(a, lengths: list[int], vocabs: list[int]) -> None:
    print(f"\nstep peak memory of one packed step vs vocabulary (fresh process per point; a row of L tokens, "
          f"loss on its second half; MiB over the memory before the step; {a.device})")  # fmt: skip
    cols = " ".join(f"{'L=' + str(n):>9s}" for n in lengths)
    print(f"{'vocab':>7s} {'LM head':13s} {cols} {'B/token':>9s}")
    for vocab in vocabs:
        for head, flags in MEMORY_HEADS.items():
            points = []
            for n in lengths:
                cmd = [sys.executable, __file__, "--memory-probe", str(n), "--memory-vocab", str(vocab),
                       "--device", a.device, "--threads", str(a.threads)]  # fmt: skip
                cmd += [f"--{k.replace('_', '-')}" for k in flags]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                points.append(json.loads(out.stdout.strip().splitlines()[-1]))
            d_bytes = (points[-1]["step_mb"] - points[0]["step_mb"]) * 2**20
            per_token = d_bytes / (points[-1]["length"] - points[0]["length"])
            row = " ".join(f"{p['step_mb']:9.0f}" for p in points)
            print(f"{vocab:7d} {head:13s} {row} {per_token:9.0f}", flush=True)


# ---- plain HF ---------------------------------------------------------------------------------------


def hf_step(model, plan, optimizer, *, device) -> None:
    for mb in plan:
        ids = mb.input_ids.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_hf(model_dir: Path, reps: int, device: torch.device) -> None:
    cfg = LearnerConfig(lr=1e-6)
    learner = Learner(model_dir, cfg, device=device)
    rows = single_call_rows(8, 1024, 256, hf_model(learner.model).config.vocab_size)
    plan = prepare_batch(rows, cfg).plan
    real = sum(mb.real_tokens for mb in plan)
    runs = {
        "learner": lambda: learner.step(rows),
        "hf+adamw": lambda: hf_step(learner.model, plan, learner.optimizer, device=device),
    }
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            times[name].append(measure(fn, device).seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["hf+adamw"] / med["learner"]
    print(f"\nlearner vs HF on {real} real tokens ({device.type}): ratio {ratio:.3f} (goal >= 0.95)")


# ---- main ------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument(
        "--model-shape", default="", help="random-init model of these dimensions: tiny, qwen3-0.6b"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention", default="", help="force an attention backend: segments or flex (CUDA)")
    p.add_argument("--parent-tokens", type=int, default=4096, help="(b): parent context; workers add half")
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--reps-long", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--layouts", default=",".join(LAYOUT_LABELS),
                   help="which layouts to time (speed is relative to the first one)")  # fmt: skip
    p.add_argument("--skip-layouts", action="store_true")
    p.add_argument("--agreement", type=int, default=-1, help="1: check every layout against the per-call "
                   "computation (default: on CUDA)")  # fmt: skip
    p.add_argument("--mfu-tokens", type=int, default=-1, help="tokens of the MFU micro-batch (0: skip)")
    p.add_argument("--mfu-row", type=int, default=2048, help="row length of the MFU micro-batch")
    p.add_argument("--memory", nargs="?", const="2048,6144", default="", help="two or more row lengths")
    p.add_argument("--memory-vocabs", default="8192,65536")
    p.add_argument("--memory-probe", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--memory-vocab", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--full-logits", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hf", action="store_true", help="also compare the learner with plain HF")
    p.add_argument("--ranks", type=int, default=0, help="also compare 1 process with this many gloo ranks")
    p.add_argument("--ranks-layout", default="packed")
    p.add_argument("--ranks-budget", type=int, default=1024, help="micro-batch tokens of the ranks section")
    p.add_argument("--rank-probe", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = set(a.layouts.split(",")) - set(LAYOUT_LABELS)
    if unknown:
        p.error(f"--layouts: unknown {sorted(unknown)}; choose from {list(LAYOUT_LABELS)}")
    cuda = a.device.startswith("cuda")
    if a.mfu_tokens < 0:
        a.mfu_tokens = 32768 if cuda else 0
    if a.agreement < 0:
        a.agreement = int(cuda)
    return a


def resolve_model(a, tmp: Path) -> Path:
    if a.model_shape:
        return build_shape_model(a.model_shape, ensure_model("tiny-random"), tmp / a.model_shape)
    return ensure_model(a.model)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if a.memory_probe:
        print(json.dumps(memory_probe(a, device)))
        return
    if a.rank_probe or a.ranks:
        from bench.learner_ranks import rank_probe, run_ranks

        if a.rank_probe:
            from activities.train_ranks import end_rank

            end_rank(lambda: rank_probe(a, scenario_rows))  # a rank ends as a production rank does
    with tempfile.TemporaryDirectory(prefix="grove-bench-model-") as tmp:
        model_dir = resolve_model(a, Path(tmp))
        name = a.model_shape or a.model
        print(f"model {name}, device {device}, threads {torch.get_num_threads()}, torch {torch.__version__}")
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        if a.agreement:
            run_agreement(model_dir, a, device)
        if not a.skip_layouts:
            run_layouts("a: delegation demo step", scenario_episodes(model_dir, "a", a.parent_tokens, vocab),
                        model_dir, a, device, a.reps)  # fmt: skip
            title = f"b: parent {a.parent_tokens}, 8 workers x {a.parent_tokens // 2}, 2 compactions"
            long = scenario_episodes(model_dir, "b", a.parent_tokens, vocab)
            run_layouts(title, long, model_dir, a, device, a.reps_long)
        if a.mfu_tokens:
            run_mfu(model_dir, a, device)
        if a.hf:
            run_hf(model_dir, a.reps, device)
    if a.memory:
        run_memory(a, [int(x) for x in a.memory.split(",")], [int(x) for x in a.memory_vocabs.split(",")])
    if a.ranks:
        if device.type != "cpu":
            print("\n--ranks: gloo ranks on CPU only (a CUDA run needs one GPU per rank); skipped")
        else:
            run_ranks(a)


if __name__ == "__main__":
    main()
