"""Benchmark: another episode's calls while a gateway is sent concurrent over-long prompts.

The goal: concurrent over-long prompts of one episode refused in parallel (not one after another),
the gateway's memory bounded, the other episode's calls slowed by at most 2x (the figures with
tokenization on the event loop, and with it off the loop, are in docs/results.md).

Real services, each in its own process as deployed: a Temporal dev server (temporary SQLite), a grove
worker (episodes, io, inference; vLLM on tiny-random) in this process, the gateway as `python -m gateway`
(the tiny-random tokenizer measures every prompt), and the over-long load from `--senders` processes,
each sending 3.9 MB over-long prompts to episode A in a loop (niced, its body encoded once: it stands for
a client on another machine). Episode B's client (this process) makes
`--calls` sequential calls (a new agent each) alone, then again under the load; printed side by side:
B's median and p90 latency, their ratio, the over-long refusals' latency, and the gateway process's
peak RSS (VmHWM) before and after the load.

    PYTHONPATH=. python bench/bench_gateway_tokenize.py [--senders 4] [--calls 30] [--mb 3.9]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.services_kit import (  # noqa: E402
    MAX_MODEL_LEN,
    Services,
    agent_call,
    episode_spec,
    gateway_client,
    services,
)
from gateway.http.auth import issue_token  # noqa: E402
from gateway.http.episode_ref import episode_ref  # noqa: E402
from grove.episode_start import start_episode  # noqa: E402

SECRET = "bench-tokenize-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _base(url: str, episode_id: str) -> str:
    return f"{url}/episodes/{episode_ref(episode_id)}/v1"


def _sender(url: str, episode_id: str, chars: int, stop, latencies, busy) -> None:
    """A process sending over-long prompts to episode A until told to stop; records each refusal's time
    (a 429/503 "not now", which a hostile client ignores and re-sends at once, in `busy`). It stands for a
    client on another machine: its body is encoded once and it runs niced, so what the bench measures is
    the gateway's cost of the load, not the load generator's CPU on the same cores."""
    os.nice(19)
    body = {"model": "grove", "messages": [{"role": "user", "content": "x" * chars}], "max_tokens": 1}
    data = json.dumps(body).encode()
    headers = {
        "authorization": f"Bearer {issue_token(SECRET, episode_id)}",
        "content-type": "application/json",
    }
    with httpx.Client(base_url=_base(url, episode_id), headers=headers, timeout=600) as http:
        while not stop.is_set():
            t = time.monotonic()
            r = http.post("/chat/completions", content=data)
            if r.status_code in (429, 503) and "retry-after" in r.headers:
                busy.append(time.monotonic() - t)
                continue
            if r.status_code != 400 or r.json()["error"]["code"] != "context_length_exceeded":
                raise RuntimeError(f"over-long prompt: {r.status_code} {r.text[:300]}")
            latencies.append(time.monotonic() - t)


async def _calls(url: str, episode_id: str, n: int, first: int) -> list[float]:
    """n sequential calls of episode B, each a new agent; their latencies."""
    async with gateway_client(url, SECRET, episode_id) as http:
        return [await agent_call(http, f"b{i}", f"Task {i}.") for i in range(first, first + n)]


def _figures(latencies: list[float]) -> str:
    q = statistics.quantiles(latencies, n=10)
    return f"median {statistics.median(latencies) * 1000:7.1f} ms, p90 {q[-1] * 1000:7.1f} ms"


def _gateway(tmp: Path, address: str, store: Path, port: int) -> subprocess.Popen:
    env = {
        **os.environ, "GROVE_GATEWAY_SECRET": SECRET, "GROVE_TEMPORAL_ADDRESS": address,
        "GROVE_STORE": str(store), "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }  # fmt: skip
    argv = [sys.executable, "-m", "gateway", "--port", str(port), "--policy-model", "tiny-random"]
    argv += ["--max-model-len", str(MAX_MODEL_LEN)]  # the services' engine's
    return subprocess.Popen(argv, env=env, stdout=open(tmp / "gateway.log", "w"), stderr=subprocess.STDOUT)


async def _until_up(url: str, proc: subprocess.Popen) -> None:
    async with httpx.AsyncClient() as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.2)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    async with services(tmp) as up:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = _gateway(tmp, up.address, up.store.root, port)
        try:
            await _until_up(url, gateway)
            await _measure(args, up, url, gateway.pid)
        finally:
            gateway.terminate()
            gateway.wait()


async def _measure(args: argparse.Namespace, up: Services, url: str, gateway_pid: int) -> None:
    a, b = [episode_spec(f"bench-tok-{name}") for name in ("a", "b")]
    for spec in (a, b):
        await start_episode(up.client, spec)
    await _calls(url, b.episode_id, 3, 0)  # warm: the engine up, the first requests' imports done
    rss0 = _peak_mb(gateway_pid)
    alone = await _calls(url, b.episode_id, args.calls, 100)
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    stop, refusals, busy = ctx.Event(), manager.list(), manager.list()
    chars = int(args.mb * 1_000_000)
    senders = [
        ctx.Process(target=_sender, args=(url, a.episode_id, chars, stop, refusals, busy))
        for _ in range(args.senders)
    ]
    for p in senders:
        p.start()
    while len(refusals) < args.senders:  # every sender has been refused once: the load is on
        await asyncio.sleep(0.1)
    pool = _children(gateway_pid)  # the gateway's worker processes (tokenizer, body decoding) by now
    cpu0, pool0, t0 = _cpu_s(gateway_pid), sum(map(_cpu_s, pool)), time.monotonic()
    loaded = await _calls(url, b.episode_id, args.calls, 1000)
    wall = time.monotonic() - t0
    cpu, pool_cpu = _cpu_s(gateway_pid) - cpu0, sum(map(_cpu_s, pool)) - pool0
    stop.set()
    for p in senders:
        p.join()
    print(f"episode B, {args.calls} sequential calls, alone: {_figures(alone)}")
    print(
        f"episode B, {args.calls} sequential calls, {args.senders} senders of {args.mb:g} MB over-long "
        f"prompts: {_figures(loaded)}"
    )
    ratio = statistics.median(loaded) / statistics.median(alone)
    print(f"slow-down of B's median: {ratio:.2f}x (goal <= 2x)")
    print(f"over-long prompts refused: {len(refusals)}, each in {_figures(list(refusals))}")
    if busy:
        print(f"answered 429/503 (retry later): {len(busy)}, each in {_figures(list(busy))}")
    print(
        f"under the load: gateway process {cpu / wall:.0%} of a core, its {len(pool)} worker processes "
        f"{pool_cpu / wall:.0%} (niced)"
    )
    print(f"gateway peak RSS: {rss0:.0f} MB before the load, {_peak_mb(gateway_pid):.0f} MB after it")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--mb", type=float, default=3.9)
    asyncio.run(main(parser.parse_args()))
