"""Benchmark: how long the workflow tasks of a ledger restore take (against Temporal's deadlock detector).

A long episode hands its ledger to its next workflow run as object-store pages (ledger/handover.py);
the new run restores them before it admits anything. Temporal fails a workflow task that does not yield
within 2 s (`_DeadlockError`), so no single workflow task of a restore may grow with the ledger.

Real services in one process: a Temporal dev server (temporary SQLite), a worker serving the episodes and
io queues, a temporary local store. The bench writes the pages a long episode of `--calls` calls would
have written (`--per-run` calls per run, each run writing what changed since its restore, pages of
`--page-items`), starts an EpisodeWorkflow run with that carry, waits for the restore through an
`open_context` Update (it waits for the ledger), then reads the run's history and prints, per workflow
task: the longest one (WorkflowTaskStarted -> WorkflowTaskCompleted, server time), the restore's wall
time and the number of pages.

    .venv/bin/python bench/bench_ledger_restore.py                  # 20,000 calls, 580 per run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.api.enums.v1 import EventType  # noqa: E402

from cli.worker import run_worker  # noqa: E402
from grove import queues  # noqa: E402
from grove.client import connect  # noqa: E402
from grove.contracts import EpisodeProgress, EpisodeSpec, HarnessSpec  # noqa: E402
from grove.receipts import ContextOrigin, ContextRecord, TokenDigests  # noqa: E402
from grove.sampling import SamplingConfig  # noqa: E402
from grove.store_layout import ledger_page_key, staging_key  # noqa: E402
from harnesses import scenario  # noqa: E402
from infra.temporal import TemporalDevServer  # noqa: E402
from ledger.handover import (  # noqa: E402
    EpisodeCarry,
    EpisodeRun,
    LedgerPage,
    apply_page,
    changed_pages,
    pack_page,
    unpack_page,
)
from ledger.ledger import Ledger  # noqa: E402
from storage.local import LocalStore  # noqa: E402


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()  # real digests: as incompressible as the bench's


def write_long_ledger(store: LocalStore, episode_id: str, calls: int, per_run: int, items: int) -> list[str]:
    """The page keys a `calls`-call episode of one context (every call a branch of the root, as the
    20,000-call bench drives it) leaves after its hand-overs: each run writes what changed."""
    ledger = Ledger(episode_id=episode_id, group_id="g")
    ledger.open_context(ContextRecord(context_id="parent", agent="parent", origin=ContextOrigin.ROOT))
    saved_contexts: dict = {}
    saved_calls: dict = {}
    keys: list[str] = []
    run = 0
    for i in range(calls):
        call_id = f"parent.c{i}"
        digests = TokenDigests(
            prompt_len=6 if i == 0 else 8, completion_len=1, prompt_sha256=_sha(f"p{i}"),
            completion_sha256=_sha(f"c{i}"), logprobs_sha256=_sha(f"l{i}"),
        )  # fmt: skip
        ledger.admit(call_id, "parent", extends=None if i == 0 else "parent.c0", branch=i > 0)
        ledger.complete(call_id, staging_key(episode_id, call_id), digests, 0, "length")
        if (i + 1) % per_run == 0 or i + 1 == calls:
            for k, page in enumerate(changed_pages(ledger, saved_contexts, saved_calls, items)):
                key = ledger_page_key(episode_id, run, "handover", k)
                store.put_if_absent(key, page.model_dump_json().encode())
                keys.append(key)
            saved_contexts = {k: v.model_copy(deep=True) for k, v in ledger.contexts.items()}
            saved_calls = dict(ledger.calls)
            run += 1
    return keys


def task_durations(history) -> list[float]:
    """Seconds from each WorkflowTaskStarted to its WorkflowTaskCompleted (server clock)."""
    out, started = [], None
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = e.event_time.ToDatetime()
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started is not None:
            out.append((e.event_time.ToDatetime() - started).total_seconds())
            started = None
    return out


def unpack_only(args: argparse.Namespace) -> None:
    """No services: the CPU work of a restore as the workflow does it (unpack and join), per page and in
    all, on this machine: what one workflow task does now (one page) against what it did (every page)."""
    store = LocalStore(Path(tempfile.mkdtemp(prefix="bench-restore-")))
    keys = write_long_ledger(store, "bench/s000001/t0/g0", args.calls, args.per_run, args.page_items)
    packed = [pack_page(LedgerPage.model_validate_json(store.get(k))) for k in keys]
    ledger = Ledger(episode_id="bench/s000001/t0/g0", group_id="g")
    per_page = []
    for data in packed:
        t0 = time.perf_counter()
        apply_page(ledger, unpack_page(data))
        per_page.append(time.perf_counter() - t0)
    median = sorted(per_page)[len(per_page) // 2]
    print(
        f"{args.calls} calls, {len(keys)} pages, {sum(map(len, packed)) / 1e6:.2f} MB packed: unpack + join "
        f"per page max {max(per_page) * 1e3:.0f} ms, median {median * 1e3:.0f} ms; "
        f"all pages {sum(per_page):.2f} s"
    )


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    server = TemporalDevServer(tmp / "temporal").start()
    worker = None
    try:
        client = await connect(server.address)
        store = LocalStore(tmp / "store")
        run = f"bench-restore-{uuid.uuid4().hex[:6]}"
        eid = f"{run}/s000001/t0/g0"
        t0 = time.monotonic()
        keys = write_long_ledger(store, eid, args.calls, args.per_run, args.page_items)
        stored = sum(len(store.get(k)) for k in keys)
        took = time.monotonic() - t0
        print(f"{args.calls} calls: {len(keys)} pages, {stored / 1e6:.2f} MB of JSON ({took:.0f} s)")
        worker = asyncio.create_task(run_worker(client, [queues.EPISODES, queues.IO], store=store))
        spec = EpisodeRun(
            **EpisodeSpec(
                run_id=run, step=1, group_id="g", episode_id=eid, task=scenario.make_task(0),
                harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=1),
                ledger_page_items=args.page_items,
            ).model_dump(),
            carry=EpisodeCarry(run_index=len(keys), ledger_pages=keys),
        )  # fmt: skip
        t0 = time.monotonic()
        handle = await client.start_workflow("EpisodeWorkflow", spec, id=eid, task_queue=queues.EPISODES)
        worker_ctx = ContextRecord(context_id="after", agent="after", origin=ContextOrigin.ROOT)
        await handle.execute_update("open_context", worker_ctx, result_type=ContextRecord)
        restored = time.monotonic() - t0
        progress = await handle.query("progress", result_type=EpisodeProgress)
        most = progress.restore.most_pages_per_task if progress.restore else "?"
        history = await handle.fetch_history()
        durations = task_durations(history)
        loads = sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        print(
            f"restore: {restored:.2f} s wall to the first admitted Update; {len(durations)} workflow tasks, "
            f"longest {max(durations):.3f} s, sum {sum(durations):.2f} s; {loads} pages loaded; "
            f"most pages unpacked in one task: {most}"
        )
        await handle.terminate("bench done")
    finally:
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker
        server.stop()


if __name__ == "__main__":
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--per-run", type=int, default=580, help="calls per workflow run (hand-over)")
    parser.add_argument("--page-items", type=int, default=1_000, help="EpisodeSpec.ledger_page_items")
    parser.add_argument("--unpack-only", action="store_true", help="no services: time unpack + join per page")
    parsed = parser.parse_args()
    if parsed.unpack_only:
        unpack_only(parsed)
    else:
        asyncio.run(main(parsed))
