"""Benchmark: the episode page of a real captured episode of 1,000+ calls (docs/results.md section 3.14).

One external episode through a real gateway process and a worker process with the sleeping engine
(bench/bench_fleet.py's pair): a lead whose first call spawns `--agents` workers, each continuing its
conversation for `--calls` calls, concurrently; closed and materialized. Then `grove episode view`'s
steps are timed: gathering (describe, result, rows, call archive, every run's history), the HTML, its
size, and in a real headless Chromium the time from the script's start to the list's first paint, the
DOM rows the virtualized list holds, and opening the last call.

    .venv/bin/python bench/bench_episode_view.py --agents 120 --calls 10    # 1,201 calls
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_fleet import episode, spec, start_pair, stop, wait_healthy  # noqa: E402
from cli.episode_view import gather_view, token_text  # noqa: E402
from cli.view_html import episode_html  # noqa: E402
from grove.client import connect  # noqa: E402
from grove.episode_start import start_episode  # noqa: E402
from infra.temporal import TemporalDevServer  # noqa: E402
from storage.local import LocalStore  # noqa: E402
from tests.viewer.chromium import chromium  # noqa: E402

READY = "new Promise(r => { const t = () => window.groveViewReady ? r(window.groveViewReady) : requestAnimationFrame(t); t(); })"  # noqa: E501


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        tmp_path = Path(tmp)
        server = TemporalDevServer(tmp_path / "temporal").start()
        procs: list = []
        try:
            client = await connect(server.address)
            procs, url = start_pair(server.address, tmp_path / "store", args.latency_ms / 1000, tmp_path, 0)
            await wait_healthy(url, procs)
            s = spec(f"view-{uuid.uuid4().hex[:6]}", 0)
            await start_episode(client, s)
            t0 = time.monotonic()
            await episode(url, s.episode_id, args.agents + 1, args.calls, [])
            await client.get_workflow_handle(s.episode_id).result()
            print(f"episode {s.episode_id}: {1 + args.agents * args.calls} calls captured and closed in "
                  f"{time.monotonic() - t0:.1f} s", flush=True)  # fmt: skip
            t1 = time.monotonic()
            store = LocalStore(tmp_path / "store")
            view = await gather_view(client, store, s.episode_id, token_text("tiny-random"))
            t2 = time.monotonic()
            page = episode_html(view)
            t3 = time.monotonic()
            path = tmp_path / "episode.html"
            path.write_text(page, encoding="utf-8")
            print(f"gather {t2 - t1:.2f} s ({len(view['calls'])} calls, {len(view['rows'])} rows), html "
                  f"{(t3 - t2) * 1000:.0f} ms, {len(page.encode()) / 1e6:.2f} MB", flush=True)  # fmt: skip
            await in_browser(path, tmp_path, view["calls"][-1]["id"])
        finally:
            stop(procs)
            server.stop()


async def in_browser(path: Path, tmp_path: Path, last: str) -> None:
    async with chromium(tmp_path / "profile") as page:
        t = time.monotonic()
        await page.open(path.as_uri())
        ready = await page.js(READY)
        load = time.monotonic() - t
        rows = await page.js("document.querySelectorAll('.call-row').length")
        t = time.monotonic()
        await page.js(
            "(() => { const s = document.getElementById('call-scroll'); s.scrollTop = s.scrollHeight;"
            " s.dispatchEvent(new Event('scroll')); return new Promise(r => requestAnimationFrame(() => {"
            f" document.querySelector('.call-row[data-call=\"{last}\"]').click(); r(1); }})); }})()"
        )
        opened = time.monotonic() - t
        print(f"chromium: navigation to first paint {load * 1000:.0f} ms (script start to first paint "
              f"{ready:.0f} ms), {rows} call rows in the DOM, scroll to the last call and open it "
              f"{opened * 1000:.0f} ms", flush=True)  # fmt: skip


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=120, help="workers spawned by the lead's first call")
    ap.add_argument("--calls", type=int, default=10, help="calls per worker")
    ap.add_argument("--latency-ms", type=float, default=5.0, help="the engine's fixed latency per call")
    return ap.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
