"""Benchmark: one GRPO learner step on forest rows vs a plain Hugging Face forward+backward.

Builds a GRPO group of synthetic multi-agent episodes (parent turns, workers whose answers return
to the parent, compactions, kept forks, retries), turns them into rows with the real reconstruction
(trainer/forest.py), then times, interleaved in one process:

- learner: `Learner.step(rows)`: validation, advantages, micro-batch planning, forward, processed
  logprobs, PPO-clip loss, backward, clip, AdamW step;
- hf: over the *same* padded micro-batch tensors, `model(input_ids, labels=input_ids).loss.backward()`
  then the same AdamW step (and, separately, without the optimizer step).

Prints tokens/s of each and the ratio learner / hf (goal >= 0.95), then the tokens forwarded by
forest rows vs per-call rows (each eligible call as its own prompt+completion sequence) vs the
unique tokens of the episodes. On CUDA also prints an MFU estimate (6 * params * tokens / peak).

    .venv/bin/python bench/bench_learner.py [--model tiny-random|tiny|smollm2|PATH] [--episodes 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.registry import ensure_model  # noqa: E402
from tests.learner.forests import Episode, random_episode, rows_from_calls  # noqa: E402
from trainer.config import LearnerConfig  # noqa: E402
from trainer.learner import Learner, prepare_batch  # noqa: E402

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def episodes(n: int, vocab: int, size: int, scale: int) -> list[Episode]:
    rng = np.random.default_rng(0)
    return [
        random_episode(rng, f"ep{j}", "g0", float(j % 3), vocab=vocab, size=size, scale=scale)
        for j in range(n)
    ]


def token_counts(eps: list[Episode], rows) -> dict[str, int]:
    """Tokens forwarded by forest rows and by per-call rows, and the unique tokens they cover.

    Unique: every call on some row's path counted once, a root with its whole prompt, a
    continuation with only what it adds (the new observation and its completion).
    """
    by_id = {(ep.episode_id, c.call_id): c for ep in eps for c in ep.calls}
    on_rows = {(r.episode_id, s.call_id) for r in rows for s in r.spans}
    unique = 0
    for episode_id, call_id in on_rows:
        c = by_id[(episode_id, call_id)]
        parent = by_id[(episode_id, c.parent_call_id)] if c.parent_call_id else None
        inherited = parent.prompt.size + parent.completion.size if parent else 0
        unique += c.prompt.size - inherited + c.completion.size
    per_call = sum(c.prompt.size + c.completion.size for c in by_id.values() if c.eligible)
    return {"forest_rows": sum(len(r.input_ids) for r in rows), "per_call_rows": per_call, "unique": unique}


def hf_step(model, plan, optimizer, *, with_optimizer: bool, device) -> None:
    for mb in plan:
        ids = mb.input_ids.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    if with_optimizer:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn, device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn(); CPU time is the fairer measure on a shared box."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--size", type=int, default=8, help="parent turns per episode")
    p.add_argument("--scale", type=int, default=8, help="token-count multiplier of the synthetic calls")
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    cfg = LearnerConfig(lr=1e-6, micro_batch_tokens=a.micro_batch_tokens)
    learner = Learner(ensure_model(a.model), cfg, device=a.device)
    device, model = learner.device, learner.model
    vocab = model.config.vocab_size
    eps = episodes(a.episodes, vocab, a.size, a.scale)
    rows = [r for ep in eps for r in rows_from_calls(ep)]
    plan = prepare_batch(rows, cfg).plan
    real = sum(mb.real_tokens for mb in plan)
    padded = sum(mb.padded_tokens for mb in plan)
    params = sum(p.numel() for p in model.parameters())
    loss_tokens = prepare_batch(rows, cfg).denominator
    print(f"model {a.model}: {params / 1e6:.2f}M params, device {device}, threads {torch.get_num_threads()}")
    print(f"batch: {a.episodes} episodes, {len(rows)} rows, {len(plan)} micro-batches, {real} real / "
          f"{padded} padded tokens, {loss_tokens} loss tokens")  # fmt: skip

    runs = {
        "learner": lambda: learner.step(rows),
        "hf+adamw": lambda: hf_step(model, plan, learner.optimizer, with_optimizer=True, device=device),
        "hf fwd+bwd": lambda: hf_step(model, plan, learner.optimizer, with_optimizer=False, device=device),
    }
    for fn in runs.values():  # warm-up (allocator, oneDNN/cuBLAS plans, optimizer state)
        timed(fn, device)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for _ in range(a.reps):  # interleaved, so drift in machine load hits all three alike
        for name, fn in runs.items():
            times[name].append(timed(fn, device))
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    for name, s in med.items():
        rates = f"{real / s:10.0f} real tok/s {padded / s:10.0f} padded tok/s"
        print(f"{name:11s} median wall {s * 1e3:9.1f} ms {rates}, cpu {cpu[name] * 1e3:9.1f} ms")
    if device.type == "cpu":
        print(f"cpu-time ratio learner / (hf + same AdamW step) = {cpu['hf+adamw'] / cpu['learner']:.3f}")
    ratio = med["hf+adamw"] / med["learner"]
    print(f"wall ratio learner / (hf fwd+bwd + same AdamW step) = {ratio:.3f}  (goal >= 0.95)")
    print(f"wall ratio learner / (hf fwd+bwd alone)             = {med['hf fwd+bwd'] / med['learner']:.3f}")
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
        flops = 6 * params * real / med["learner"]
        mfu = f"{flops / peak:.1%} of {peak / 1e12:.0f} TFLOP/s" if peak else "unknown peak"
        print(f"{name}: {flops / 1e12:.1f} TFLOP/s (6 * params * real tokens), MFU {mfu}")
    c = token_counts(eps, rows)
    print(f"tokens forwarded for these episodes: forest rows {c['forest_rows']}, per-call rows "
          f"{c['per_call_rows']} ({c['per_call_rows'] / c['forest_rows']:.2f}x forest), unique tokens "
          f"{c['unique']} (forest = {c['forest_rows'] / c['unique']:.2f}x unique)")  # fmt: skip


if __name__ == "__main__":
    main()
