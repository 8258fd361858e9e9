"""A real headless Chromium (Debian's `chromium`, installed by infra/chromium.sh) driven over the DevTools
protocol: open a file, evaluate script, move the mouse, take a screenshot.

The flags keep Chromium off the network entirely (this machine's network is closed; without them it
retries Google's hosts at every start). Chromium writes its DevTools port to `DevToolsActivePort` in its
fresh profile folder; the test talks to the page's target over a websocket. The process is ended by its
own pid when the block ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import websockets

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--remote-debugging-port=0", "--remote-allow-origins=*",
    "--window-size=1500,1000", "--hide-scrollbars",
]  # fmt: skip
START_WAIT = 120.0


class ChromiumMissingError(RuntimeError):
    """No Chromium at /usr/bin/chromium: run `bash infra/chromium.sh` (the test command does)."""


class Page:
    """One page target of the browser: `call` sends a DevTools command and returns its result."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    async def call(self, method: str, **params: Any) -> dict:
        msg_id = next(self.ids)
        await self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    async def open(self, url: str) -> None:
        await self.call("Page.enable")
        self.events.clear()
        await self.call("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(json.loads(await self.ws.recv()))

    async def js(self, expression: str) -> Any:
        """The value of `expression` (awaited if a promise); a thrown error fails with its text."""
        out = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"page error: {out['exceptionDetails']}")
        return out["result"].get("value")

    async def mouse_move(self, x: float, y: float) -> None:
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    async def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])
        path.write_bytes(data)
        return data


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Page]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        raise ChromiumMissingError(f"no Chromium at {CHROMIUM}: run `bash infra/chromium.sh` (as root)")
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = await _port(profile / "DevToolsActivePort", proc)
        async with httpx.AsyncClient() as http:
            targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with websockets.connect(url, max_size=64 * 2**20) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _port(path: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before listening")
        if path.exists() and path.read_text().strip():
            return int(path.read_text().split()[0])
        await asyncio.sleep(0.1)
    raise TimeoutError(f"chromium wrote no {path} within {START_WAIT} s")
