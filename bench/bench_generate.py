"""Benchmark: generate-activity overhead vs the bare engine, generation throughput, weight publication time.

In one process, on one PolicyEngine (real vLLM), interleaved call by call so that drift hits all paths:

- direct:    `engine.generate(prompt, sampling, seed)`;
- activity:  the generate activity run by temporalio.testing.ActivityEnvironment: prompt build, staged
             check, generation, staging write (receipt + safetensors arrays) to a LocalStore;
- temporal:  the full capture path on a real Temporal dev server: a workflow Update (what the gateway
             sends to EpisodeWorkflow) that executes the `generate` activity on the inference worker.

Prints p50/p95 latency of each and the overhead over direct; then generation tokens/s at batch 1 and 16
(256 tokens per request, ignore_eos); then the time of weight
publications (perturbed copies of the model, loaded in place).

    .venv/bin/python bench/bench_generate.py [--model tiny|tiny-random|smollm2|PATH] [--calls 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio import workflow  # noqa: E402
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.engine import PolicyEngine  # noqa: E402
from activities.engine_config import EngineConfig  # noqa: E402
from activities.generate import call_seed  # noqa: E402
from activities.inference_worker import InferenceActivities, build_inference_worker  # noqa: E402
from grove import queues  # noqa: E402
from grove.client import connect  # noqa: E402
from grove.contracts import GenerateInput, GenerateResult, PromptSpec  # noqa: E402
from grove.sampling import SamplingConfig  # noqa: E402
from infra.temporal import TemporalDevServer  # noqa: E402
from models.registry import ensure_model  # noqa: E402
from storage.local import LocalStore  # noqa: E402


@workflow.defn(sandboxed=False)
class BenchCalls:
    """Each Update runs one generate activity, as EpisodeWorkflow does for a gateway call."""

    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._done)

    @workflow.update
    async def call(self, inp: GenerateInput) -> GenerateResult:
        return await workflow.execute_activity(
            "generate", inp, task_queue=queues.INFERENCE, start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=20), retry_policy=RetryPolicy(maximum_attempts=1),
            result_type=GenerateResult,
        )  # fmt: skip

    @workflow.signal
    def finish(self) -> None:
        self._done = True


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(name: str, ms: list[float], base: float | None) -> str:
    p50, p95 = pct(ms, 0.5), pct(ms, 0.95)
    extra = "" if base is None else f"   overhead p50 {p50 - base:+7.1f} ms"
    return f"  {name:<9} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   mean {statistics.fmean(ms):7.1f} ms{extra}"


async def overhead(engine: PolicyEngine, store: LocalStore, client, calls: int, max_tokens: int) -> None:
    tok = engine.tokenizer
    text = "<|im_start|>user\nWhat is 12 + 7? Answer briefly.<|im_end|>\n<|im_start|>assistant\n"
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    sampling = SamplingConfig(max_tokens=max_tokens, ignore_eos=True)
    acts = InferenceActivities(engine, store)
    times: dict[str, list[float]] = {"direct": [], "activity": [], "temporal": []}
    run_id = uuid.uuid4().hex[:8]
    caller = Worker(client, task_queue="bench", workflows=[BenchCalls])
    async with build_inference_worker(client, engine, store), caller:
        handle = await client.start_workflow(BenchCalls.run, id=f"bench-{run_id}", task_queue="bench")
        for i in range(calls + 3):  # the first 3 rounds warm up
            ep = f"bench-{run_id}"
            spec = PromptSpec(ids=prompt)
            inp = {
                p: GenerateInput(episode_id=ep, call_id=f"{p}-{i}", prompt=spec, sampling=sampling)
                for p in ("activity", "temporal")
            }
            t = time.perf_counter()
            await engine.generate(prompt, sampling, call_seed(ep, f"direct-{i}"), f"direct-{run_id}-{i}")
            t1 = time.perf_counter()
            await ActivityEnvironment().run(acts.generate, inp["activity"])
            t2 = time.perf_counter()
            await handle.execute_update(BenchCalls.call, inp["temporal"])
            t3 = time.perf_counter()
            if i >= 3:
                for name, dt in (("direct", t1 - t), ("activity", t2 - t1), ("temporal", t3 - t2)):
                    times[name].append(dt * 1e3)
        await handle.signal(BenchCalls.finish)
    base = pct(times["direct"], 0.5)
    print(f"per-call latency, {calls} calls of {len(prompt)} prompt + {max_tokens} generated tokens:")
    for name in times:
        print(line(name, times[name], None if name == "direct" else base))


async def throughput(engine: PolicyEngine, tokens: int) -> None:
    prompt = engine.tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    sampling = SamplingConfig(max_tokens=tokens, ignore_eos=True)
    await engine.generate(prompt, sampling, 0, "tp-warm")
    for batch in (1, 16):
        engine.batch_stats.reset()
        t = time.perf_counter()
        outs = await asyncio.gather(
            *[
                engine.generate(prompt, sampling, s, f"tp-{batch}-{s}-{uuid.uuid4().hex[:6]}")
                for s in range(batch)
            ]
        )
        dt = time.perf_counter() - t
        n = sum(o.completion_ids.size for o in outs)
        print(
            f"  batch {batch:>2}: {n / dt:7.0f} tokens/s ({n} tokens in {dt:.2f} s; "
            f"max running in one engine step {engine.batch_stats.max_running})"
        )


async def publication(engine: PolicyEngine, work: Path, times: int) -> None:
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src = engine.source_dir
    base = load_file(str(src / "model.safetensors"))
    for k in range(times):
        folder = work / f"v{k}"
        shutil.copytree(src, folder, ignore=shutil.ignore_patterns("model.safetensors"))
        gen = torch.Generator().manual_seed(k)
        save_file({n: t + 0.01 * torch.randn(t.shape, generator=gen) for n, t in base.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
        report = await engine.publish(folder, engine.version + 1)
        print(
            f"  v{report.version}: {report.seconds * 1e3:6.1f} ms total "
            f"(reload + repack {report.reload_seconds * 1e3:.1f} ms, repacked {list(report.repacked)})"
        )


async def main(args: argparse.Namespace) -> None:
    model_dir = ensure_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="grove-bench-generate-"))
    server = TemporalDevServer(work / "temporal").start()
    t = time.perf_counter()
    engine = await PolicyEngine.start(EngineConfig(model_dir=model_dir, max_model_len=2048))
    print(f"model {args.model} ({model_dir}); engine start {time.perf_counter() - t:.1f} s")
    try:
        client = await connect(server.address)
        await overhead(engine, LocalStore(work / "store"), client, args.calls, args.max_tokens)
        print(f"generation throughput ({args.tokens} tokens per request, ignore_eos):")
        await throughput(engine, args.tokens)
        print("weight publication (perturbed copies, in place, prefix cache reset):")
        await publication(engine, work / "weights", 3)
    finally:
        await engine.shutdown()
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    asyncio.run(main(parser.parse_args()))
