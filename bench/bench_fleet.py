"""Benchmark: N external episodes at once through real gateways and Temporal, with an engine of fixed latency.

What grove costs when many episodes are in flight, with the model taken out: every call is a real
HTTP request to a gateway process (auth, identity, prompt rendering with the tiny-random tokenizer,
chat record, `call` and `deliver` Updates), a real `EpisodeWorkflow` on the Temporal dev server, the
real generate activity on a worker process whose engine only sleeps `--latency-ms`
(bench/sleep_engine.py) and stages the arrays in a local store. Each episode has `--agents` agents: a
lead whose first call spawns the others (`x-grove-spawned-by`), every agent continuing its own
conversation for `--calls` calls, the workers concurrently; then the episode closes and materializes.

For each number of pairs P in `--pairs` (P gateway processes + P worker processes; episode i talks to
gateway i mod P, every worker serves every queue) and each N in `--episodes`, it prints:

- calls/s over all episodes (first call sent to last response received; closes not included);
- capture overhead per call, p50 and p99: the call's HTTP latency minus the engine's sleep;
- Temporal history per call: events and bytes of every run of the episodes' workflows (closes and
  materialize included), divided by their calls;
- the load average before and after, and the CPU seconds of each process (worker and gateway of each
  pair, the Temporal dev server, this driver) during the N episodes, also per call: where the time went.

    .venv/bin/python bench/bench_fleet.py --pairs 1 --episodes 1,8,32,128
    .venv/bin/python bench/bench_fleet.py --pairs 2 --episodes 32,128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from gateway.http.auth import issue_token  # noqa: E402
from gateway.http.episode_ref import episode_ref  # noqa: E402
from grove.client import connect, workflow_runs  # noqa: E402
from grove.contracts import EpisodeSpec, HarnessSpec  # noqa: E402
from grove.episode_start import start_episode  # noqa: E402
from grove.sampling import SamplingConfig  # noqa: E402
from harnesses import scenario  # noqa: E402
from infra.temporal import TemporalDevServer  # noqa: E402

SECRET = "bench-fleet-secret-0123456789abcdef"
MAX_MODEL_LEN = 512
MODEL = "tiny-random"
HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


# ------------------------------------------------------------------------------------------ processes


def serve_worker(address: str, store: str, latency_s: float) -> None:
    """A worker process: episodes, io and inference queues, the sleeping engine."""
    from bench.sleep_engine import SleepEngine
    from cli.worker import run_worker
    from grove import queues
    from models.registry import ensure_model
    from storage.local import LocalStore

    async def main() -> None:
        client = await connect(address)
        engine = SleepEngine(ensure_model(MODEL), MAX_MODEL_LEN, latency_s)
        await run_worker(client, [queues.EPISODES, queues.IO, queues.INFERENCE], store=LocalStore(store),
                         model=MODEL, engine=engine, say=lambda line: print(line, flush=True))  # fmt: skip

    asyncio.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_pair(address: str, store: Path, latency_s: float, logs: Path, i: int) -> tuple[list, str]:
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "GROVE_GATEWAY_SECRET": SECRET,
        "TOKENIZERS_PARALLELISM": "false",
    }
    worker = subprocess.Popen(
        [sys.executable, str(HERE), "--serve-worker", "--address", address, "--store", str(store),
         "--latency-ms", str(latency_s * 1000)],
        stdout=(logs / f"worker{i}.log").open("w"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115
    )  # fmt: skip
    port = _free_port()
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--port", str(port), "--address", address, "--store", str(store),
         "--policy-model", MODEL, "--max-model-len", str(MAX_MODEL_LEN)],
        stdout=(logs / f"gateway{i}.log").open("w"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115
        cwd=ROOT,
    )  # fmt: skip
    return [worker, gateway], f"http://127.0.0.1:{port}"


async def wait_healthy(url: str, procs: list, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a process of the pair at {url} exited")
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"gateway {url} not healthy in {timeout} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children that ended (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------ episodes


def spec(run: str, j: int) -> EpisodeSpec:
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/s000001/t{j}", episode_id=f"{run}/s000001/t{j}/g0",
        task=scenario.make_task(j), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=1), idle_timeout_s=900,
    )  # fmt: skip


async def agent_turns(http, agent: str, headers: dict, first: list, calls: int, lat: list) -> str:
    """`calls` turns of one agent's conversation; returns its first call id."""
    messages, first_id = list(first), None
    for turn in range(calls):
        t = time.monotonic()
        body = {"model": "grove", "messages": messages, "max_tokens": 1}
        r = await http.post("/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"{agent}: {r.status_code} {r.text[:300]}")
        lat.append(time.monotonic() - t)
        first_id = first_id or r.headers["x-grove-call-id"]
        reply = r.json()["choices"][0]["message"]
        messages += [{"role": "assistant", "content": reply.get("content") or ""},
                     {"role": "user", "content": f"Go on ({turn})."}]  # fmt: skip
    if first_id is None:
        raise RuntimeError(f"agent {agent!r} made no call (calls={calls})")
    return first_id


async def episode(url: str, eid: str, agents: int, calls: int, lat: list) -> None:
    ref = episode_ref(eid)
    auth = {"authorization": f"Bearer {issue_token(SECRET, eid)}"}
    async with httpx.AsyncClient(base_url=f"{url}/episodes/{ref}/v1", headers=auth, timeout=900) as http:
        system = {"role": "system", "content": "Be brief."}
        lead_first = [system, {"role": "user", "content": "Split the task."}]
        spawner = await agent_turns(http, "lead", {"x-grove-agent": "lead"}, lead_first, 1, lat)
        workers = [
            agent_turns(http, f"w{k}", {"x-grove-agent": f"w{k}", "x-grove-spawned-by": spawner},
                        [system, {"role": "user", "content": f"Part {k}."}], calls, lat)
            for k in range(1, agents)
        ]  # fmt: skip
        await asyncio.gather(*workers)
        r = await http.post(
            f"{url}/episodes/{ref}/close", params={"wait": "false"}, json={"final_answer": "x"}
        )
        if r.status_code >= 300:
            raise RuntimeError(f"close {eid}: {r.status_code} {r.text[:300]}")


async def history_per_call(client, eids: list[str], calls: int) -> tuple[float, float, float]:
    """(events, bytes, updates) per call over every run of these episodes' workflows."""
    events = size = updates = 0
    for eid in eids:
        await client.get_workflow_handle(eid).result()
        for history in await workflow_runs(client, eid):
            events += len(history.events)
            size += sum(ev.ByteSize() for ev in history.events)
            updates += sum(
                1
                for ev in history.events
                if ev.HasField("workflow_execution_update_accepted_event_attributes")
            )
    return events / calls, size / calls, updates / calls


async def measure(
    client, urls: list[str], n: int, agents: int, calls: int, latency_s: float, procs, server_pid: int
) -> dict:
    run = f"fleet-{len(urls)}x-{n}-{uuid.uuid4().hex[:6]}"
    eids = [spec(run, j).episode_id for j in range(n)]
    for j in range(n):
        await start_episode(client, spec(run, j))
    lat: list[float] = []
    pids = [p.pid for p in procs] + [server_pid, os.getpid()]
    cpu0, load0, t0 = [cpu_seconds(pid) for pid in pids], os.getloadavg()[0], time.monotonic()
    await asyncio.gather(*(episode(urls[j % len(urls)], eids[j], agents, calls, lat) for j in range(n)))
    wall = time.monotonic() - t0
    cpu = [round(cpu_seconds(pid) - c, 1) for pid, c in zip(pids, cpu0, strict=True)]
    total = n * (1 + (agents - 1) * calls)
    sample = eids[: min(n, 16)]
    ev, by, up = await history_per_call(client, sample, len(sample) * (1 + (agents - 1) * calls))
    over = (np.asarray(lat) - latency_s) * 1000
    return {
        "pairs": len(urls), "episodes": n, "calls": total, "wall_s": round(wall, 1),
        "calls_per_s": round(total / wall, 1), "overhead_p50_ms": round(float(np.percentile(over, 50)), 1),
        "overhead_p99_ms": round(float(np.percentile(over, 99)), 1), "events_per_call": round(ev, 1),
        "history_bytes_per_call": round(by), "updates_per_call": round(up, 2),
        "load": f"{load0:.1f}->{os.getloadavg()[0]:.1f}", "cpu_s": cpu,
        "cpu_ms_per_call": [round(c * 1000 / total, 1) for c in cpu],
    }  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    latency_s = args.latency_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        tmp_path = Path(tmp)
        server = TemporalDevServer(tmp_path / "temporal").start()
        assert server.proc is not None  # started
        server_pid = server.proc.pid
        procs: list = []
        try:
            client = await connect(server.address)
            for p in args.pairs:
                procs, urls = [], []
                for i in range(p):
                    pair, url = start_pair(server.address, tmp_path / "store", latency_s, tmp_path, i)
                    procs += pair
                    urls.append(url)
                for k, url in enumerate(urls):
                    await wait_healthy(url, procs[2 * k : 2 * k + 2])
                # warm-up: every worker's engine and every gateway's tokenizer answer once
                await measure(client, urls, 2 * p, 2, 1, latency_s, procs, server_pid)
                print(f"{p} pair(s) up: gateways {urls}", flush=True)
                for n in args.episodes:
                    result = await measure(
                        client, urls, n, args.agents, args.calls, latency_s, procs, server_pid
                    )
                    print(measure_line(result), flush=True)
                stop(procs)
        finally:
            stop(procs)
            server.stop()


def measure_line(r: dict) -> str:
    return (
        f"pairs {r['pairs']}  episodes {r['episodes']:>3}  calls {r['calls']:>5}  wall {r['wall_s']:>6} s  "
        f"{r['calls_per_s']:>6} calls/s  overhead p50 {r['overhead_p50_ms']:>7} ms  "
        f"p99 {r['overhead_p99_ms']:>7} ms"
        f"  history {r['events_per_call']} events, {r['history_bytes_per_call']} B, {r['updates_per_call']} "
        f"Updates per call  load {r['load']}\n    CPU s (worker, gateway per pair; Temporal server; driver) "
        f"{r['cpu_s']} = ms per call {r['cpu_ms_per_call']}"
    )


def stop(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128])
    ap.add_argument("--pairs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--agents", type=int, default=3, help="agents per episode: a lead and agents-1 workers")
    ap.add_argument("--calls", type=int, default=4, help="calls per worker agent (the lead makes one)")
    ap.add_argument("--latency-ms", type=float, default=100.0, help="the engine's fixed latency per call")
    ap.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    return ap.parse_args()


if __name__ == "__main__":
    ns = parse()
    if ns.serve_worker:
        serve_worker(ns.address, ns.store, ns.latency_ms / 1000)
    else:
        asyncio.run(main(ns))
