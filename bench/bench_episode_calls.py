"""Benchmark: one external episode driven to N calls, closed and materialized (docs/results.md section 3.5).

Real services in one process: a Temporal dev server (temporary SQLite), a grove worker serving the episodes,
io and inference queues with vLLM on the tiny-random model, a temporary local object store. Calls are the
gateway's Updates (gateway/temporal/episode_client.py: addressed by workflow id, HandingOver retried), 1-token
generations, `--concurrency` at a time: the root call of context `parent`, then branches from it (short
prompts however long the episode runs; every call is an endpoint, i.e. one row).

The episode continues-as-new every `--per-run` Updates with its ledger (inline, or as object-store
pages above `--page-items` contexts + calls). Prints calls/s per segment of `--per-run` calls (does the
rate decay as the ledger grows?), close -> result time, then per workflow run: Updates, history events
and bytes, so history per run and per call can be read off directly.

    .venv/bin/python bench/bench_episode_calls.py                 # 20,000 calls (slow: results.md section 5)
    .venv/bin/python bench/bench_episode_calls.py --quick         # 600 calls, 200 per run: a smoke run

`--pattern contexts` drives the other shape of a long episode: every call opens a new context (an agent
`a{i}` per call, as a harness that starts a fresh conversation each turn), through the real gateway over
HTTP (uvicorn on a loopback port, the tiny-random model's tokenizer measuring each prompt, the chat record
and the `deliver` Update of each response). It prints calls/s at `--marks` contexts (the rate of the
`--window` calls ending at each mark; the gateway's work per call must not grow with the episode), the
bytes one request's `context_view` answer and the whole `summary` take at each mark, and per run the
largest history event and how many pass Temporal's 512 KiB payload warning size.

    .venv/bin/python bench/bench_episode_calls.py --pattern contexts --marks 100,1000,5000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.services_kit import (  # noqa: E402
    MAX_MODEL_LEN,
    Services,
    agent_call,
    episode_spec,
    gateway_client,
    services,
)
from gateway.http.embedded import serve_gateway  # noqa: E402
from gateway.http.settings import GatewaySettings  # noqa: E402
from gateway.pipeline.routing import view_request  # noqa: E402
from gateway.temporal.episode_client import HANDING_OVER, EpisodeQueryError, Episodes  # noqa: E402
from grove import queues  # noqa: E402
from grove.client import workflow_runs  # noqa: E402
from grove.contracts import (  # noqa: E402
    CallRequest,
    CloseRequest,
    PromptSpec,
)
from grove.episode_start import start_episode  # noqa: E402
from grove.headers import AGENT_HEADER  # noqa: E402
from grove.receipts import ContextOrigin, ContextRecord  # noqa: E402
from grove.store_layout import staging_key  # noqa: E402
from trainer.rows import rows_from_parquet  # noqa: E402


def call_request(episode_id: str, i: int) -> CallRequest:
    if i == 0:
        return CallRequest(call_id="parent.c0", context_id="parent", prompt=PromptSpec(ids=[11, 12, 13, 14]))
    prompt = PromptSpec(
        suffix_ids=[20 + i % 50, 7],
        parent_call_id="parent.c0",
        parent_staging_key=staging_key(episode_id, "parent.c0"),
    )
    return CallRequest(
        call_id=f"parent.c{i}", context_id="parent", extends="parent.c0", branch=True, prompt=prompt
    )


class CountingEpisodes(Episodes):
    def __init__(self, client) -> None:
        super().__init__(client)
        self.handover_retries = 0

    async def _through_handover(self, episode_id, what, update):
        async def counted():
            try:
                return await update()
            except Exception as err:
                if getattr(getattr(err, "cause", None), "type", None) == HANDING_OVER:
                    self.handover_retries += 1
                raise

        return await super()._through_handover(episode_id, what, counted)


async def drive(episodes: CountingEpisodes, episode_id: str, n: int, concurrency: int, segment: int):
    """Calls 1..n-1 (call 0 is made before); prints calls/s for each `segment` completed calls."""
    done = 0
    seg_start = time.monotonic()
    rates: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(1, n):
        queue.put_nowait(i)

    async def worker() -> None:
        nonlocal done, seg_start
        while not queue.empty():
            i = queue.get_nowait()
            await episodes.call(episode_id, call_request(episode_id, i))
            done += 1
            if done % segment == 0:
                now = time.monotonic()
                rates.append(segment / (now - seg_start))
                print(f"  calls {done - segment + 1:>6}-{done:<6} {rates[-1]:7.1f} calls/s", flush=True)
                seg_start = now

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rates


def _activity_bytes(history, activity: str, event: str) -> int:
    """Bytes of the `event` events ("scheduled" / "completed") of `activity` in one run's history."""
    scheduled: dict[int, str] = {}
    total = 0
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = name
            total += e.ByteSize() if event == "scheduled" and name == activity else 0
        elif e.HasField("activity_task_completed_event_attributes") and event == "completed":
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            total += e.ByteSize() if scheduled.get(sid) == activity else 0
    return total


def _activity_seconds(history, activity: str) -> float:
    """Scheduled -> completed seconds of `activity`'s last completion in one run's history (0: none)."""
    scheduled: dict[int, tuple[str, float]] = {}
    seconds = 0.0
    for e in history.events:
        t = e.event_time.ToNanoseconds() / 1e9
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = (e.activity_task_scheduled_event_attributes.activity_type.name, t)
        elif e.HasField("activity_task_completed_event_attributes"):
            name, at = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id, ("", t))
            seconds = t - at if name == activity else seconds
    return seconds


async def run_histories(client, episode_id: str) -> list[dict[str, int]]:
    """Per run of the episode, first to last: Updates, events, bytes, and of those bytes the ledger
    restored (load_ledger_page results, the carried inline ledger) and written (store_ledger_page)."""
    return [_run_figures(history) for history in await workflow_runs(client, episode_id)]


PAYLOAD_WARN = 512 * 1024  # Temporal's limit.blobSize.warn, the SDK's payloads_warn_size


def _run_figures(history) -> dict[str, int]:
    updates = sum(
        1 for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")
    )
    started = history.events[0].workflow_execution_started_event_attributes
    return {
        "updates": updates,
        "events": len(history.events),
        "bytes": sum(e.ByteSize() for e in history.events),
        "start_input": started.input.ByteSize(),
        "loaded": _activity_bytes(history, "load_ledger_page", "completed"),
        "written": _activity_bytes(history, "store_ledger_page", "scheduled"),
        "materialize_s": _activity_seconds(history, "materialize_episode"),
        "largest_event": max(e.ByteSize() for e in history.events),
        "over_warn": sum(e.ByteSize() > PAYLOAD_WARN for e in history.events),
    }


SECRET = "bench-episode-calls-secret-0123456789"


async def answer_bytes(client, episode_id: str, agent: str) -> tuple[int, str]:
    """Bytes of one request's `context_view` answer and of the whole `summary` (their JSON); the summary
    of a long enough episode is refused by Temporal (its payload limit, 2 MB)."""
    episodes = Episodes(client)
    view = await episodes.context_view(episode_id, view_request({AGENT_HEADER: agent}))
    try:
        summary = f"{len((await episodes.summary(episode_id)).model_dump_json())} B"
    except EpisodeQueryError as err:
        summary = f"refused ({err})"
    return len(view.model_dump_json()), summary


async def drive_contexts(url: str, eid: str, start: int, stop: int, concurrency: int) -> list[float]:
    """Calls start..stop-1, call i from agent `a{i}` (a new context each), `concurrency` at a time; the
    monotonic time each one returned, in completion order."""
    done: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(start, stop):
        queue.put_nowait(i)

    async def worker(http) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await agent_call(http, f"a{i}", f"Task {i}.")
            done.append(time.monotonic())

    async with gateway_client(url, SECRET, eid) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return done


async def main_contexts(args: argparse.Namespace, up: Services) -> None:
    marks = sorted(int(m) for m in args.marks.split(","))
    settings = GatewaySettings(
        temporal_address=up.address, store=str(up.store.root), secret=SECRET, policy_model="tiny-random",
        max_model_len=MAX_MODEL_LEN,
    )  # fmt: skip
    spec = episode_spec("bench-ctx", max_updates_per_run=args.per_run, ledger_page_items=args.page_items)
    eid = spec.episode_id
    await start_episode(up.client, spec)
    async with serve_gateway(settings, up.store) as url:
        await drive_contexts(url, eid, 0, 1, 1)  # also waits for the engine to be up
        print(
            f"episode {eid}: a new context per call, {args.concurrency} at a time, up to {marks[-1]} contexts"
        )
        t0 = time.monotonic()
        times, previous = [], 1
        for mark in marks:
            times += await drive_contexts(url, eid, previous, mark, args.concurrency)
            previous = mark
            w = min(args.window, len(times) - 1)
            rate = w / (times[-1] - times[-1 - w])
            view_b, summary_b = await answer_bytes(up.client, eid, f"a{mark - 1}")
            print(
                f"  {mark:>6} contexts: {rate:6.2f} calls/s (the last {w} calls); one request's context_view "
                f"{view_b} B, the whole summary {summary_b}",
                flush=True,
            )
        calls_s = time.monotonic() - t0
    t1 = time.monotonic()
    episodes = Episodes(up.client)
    await episodes.close(eid, CloseRequest(final_answer="done"))
    result = await episodes.result(eid)
    rows = rows_from_parquet(up.store.get(result.rows_key))
    print(
        f"{marks[-1] - 1} calls in {calls_s:.1f} s; close -> result {time.monotonic() - t1:.1f} s: status "
        f"{result.status}, {result.counts}, {len(rows)} rows"
    )
    runs = await run_histories(up.client, eid)
    print(f"{len(runs)} workflow runs: updates  events  bytes  largest-event  events>512KiB")
    for k, r in enumerate(runs):
        print(
            f"  run {k:>3} {r['updates']:>8} {r['events']:>7} {r['bytes']:>10} {r['largest_event']:>10} "
            f"{r['over_warn']:>4}"
        )


async def main(args: argparse.Namespace) -> None:
    wall0 = time.monotonic()
    async with services(Path(tempfile.mkdtemp(prefix="bench-episode-"))) as up:
        if args.pattern == "contexts":
            await main_contexts(args, up)
        else:
            await main_branches(args, up, wall0)


async def main_branches(args: argparse.Namespace, up: Services, wall0: float) -> None:
    client, store = up.client, up.store
    spec = episode_spec("bench", max_updates_per_run=args.per_run, ledger_page_items=args.page_items)
    eid = spec.episode_id
    await client.start_workflow("EpisodeWorkflow", spec, id=eid, task_queue=queues.EPISODES)
    episodes = CountingEpisodes(client)
    await episodes.open_context(
        eid, ContextRecord(context_id="parent", agent="parent", origin=ContextOrigin.ROOT)
    )
    await episodes.call(eid, call_request(eid, 0))  # also waits for the engine to be up
    print(f"episode {eid}: {args.calls} calls, {args.concurrency} at a time, {args.per_run} Updates per run")
    t0 = time.monotonic()
    rates = await drive(episodes, eid, args.calls, args.concurrency, args.per_run)
    calls_s = time.monotonic() - t0
    t1 = time.monotonic()
    await episodes.close(eid, CloseRequest(final_answer="done"))
    result = await episodes.result(eid)
    close_s = time.monotonic() - t1
    rows = rows_from_parquet(store.get(result.rows_key))
    print(
        f"{args.calls - 1} calls in {calls_s:.1f} s = {(args.calls - 1) / calls_s:.1f} calls/s overall; "
        f"first/last segment {rates[0]:.1f}/{rates[-1]:.1f} calls/s; HandingOver retries "
        f"{episodes.handover_retries}"
    )
    print(
        f"close -> result {close_s:.1f} s: status {result.status}, {result.counts}, "
        f"{len(rows)} rows ({result.num_rows} reported)"
    )
    runs = await run_histories(client, eid)
    print(
        f"{len(runs)} workflow runs ({len(runs) - 1} hand-overs): updates  events  bytes  bytes/update"
        "  start-input  ledger-loaded  ledger-written"
    )
    for k, r in enumerate(runs):
        print(
            f"  run {k:>3} {r['updates']:>8} {r['events']:>7} {r['bytes']:>10} "
            f"{r['bytes'] / max(r['updates'], 1):>8.0f} {r['start_input']:>10} {r['loaded']:>12} "
            f"{r['written']:>12}"
        )
    total_events = sum(r["events"] for r in runs)
    total_bytes = sum(r["bytes"] for r in runs)
    biggest = max(runs, key=lambda r: r["bytes"])
    print(
        f"max run: {max(r['events'] for r in runs)} events, {biggest['bytes'] / 1e6:.2f} MB (of which "
        f"ledger loaded {biggest['loaded'] / 1e6:.2f} MB, written {biggest['written'] / 1e6:.2f} MB); "
        f"per call {total_events / args.calls:.1f} events, {total_bytes / args.calls / 1e3:.2f} KB"
    )
    print(
        f"materialize_episode (scheduled -> completed) {runs[-1]['materialize_s']:.1f} s; "
        f"total wall {time.monotonic() - wall0:.0f} s (services up, calls, close, histories read)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument(
        "--per-run", type=int, default=1000, help="Updates per workflow run (max_updates_per_run)"
    )
    parser.add_argument("--page-items", type=int, default=1000, help="ledger_page_items")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--quick", action="store_true", help="600 calls, 200 per run, pages of 128: a smoke run"
    )
    parser.add_argument(
        "--pattern", choices=["branches", "contexts"], default="branches",
        help="branches: calls of one context (default); contexts: a new context per call, via the gateway",
    )  # fmt: skip
    parser.add_argument("--marks", default="100,1000,5000", help="contexts: where calls/s are printed")
    parser.add_argument("--window", type=int, default=100, help="contexts: calls per printed rate")
    ns = parser.parse_args()
    if ns.quick:
        ns.calls, ns.per_run, ns.page_items = 600, 200, 128
    asyncio.run(main(ns))
