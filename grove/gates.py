"""Test gates: points where a process holds still until a test lets it go, enabled only by an env var.

A test that must act at a moment (kill a worker while a generation is in flight, kill a trainer
half-way through a checkpoint) creates that moment instead of polling for it: it arms a named gate
point with a pattern, the product code reaches the point, announces that it is held there and waits
until the test releases it. Nothing is timed; the held state lasts as long as the test needs it.

Enabled only when $GROVE_TEST_GATES names a folder (never set in production: `Gates.from_env()` is
then None and every hook is a no-op). Files under that folder are the whole protocol, so it works
across processes (worker subprocesses started by a test inherit the variable):

    armed/<point>             exists while the point is armed; holds a regex searched in each key
    held/<point>/<key>        written by the process when a matching key is held at the point
    released/<point>/<key>    written by the test to let that one key go on

Disarming a point (removing `armed/<point>`) releases everything held there and lets later keys
pass. Keys are quoted into file names (`/` and other unsafe characters percent-encoded).

Points: `generate` (activities/engine.py: a finished generation, before it is returned; key = request id
`episode/call/attempt`), `store_put` (cli/worker.py: after the trainer's or the io worker's store wrote an
object; key = object key), `store_before_put` (the same stores, before they write an object: a test can stop
the object store while a write is about to happen), `train_rank` (activities/train_ranks.py: a learner rank
after each forward/backward pass; key = `run/step-NNNNNN/rank-R/pass-K`), `harness_starting`
(activities/harness.py: a harness process was spawned, its start not finished; key = episode id),
`harness_exited` (activities/harness.py: a launched harness process has ended, before the runner closes its
episode; key = episode id), `ledger_page_load` (activities/episode_io.py: a ledger page that a
continued-as-new episode run is about to load for its restore; key = page key), `heartbeat_query`
(activities/harness.py: the runner's heartbeat about to query the episode's ledger; key = episode id),
`engine_loading` (activities/vllm_worker_ext.py: an engine's model worker process, loading, while vLLM's start
blocks its owner; key = the owner's pid) and `chat_request` (gateway/pipeline/capture.py: a harness's chat
request arrived at the gateway, nothing decided or admitted yet; key =
`{episode id}/{launch or 0}/{x-grove-agent or -}/{number of messages}`).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from urllib.parse import quote, unquote

ENV = "GROVE_TEST_GATES"
HOLD_POLL_S = 0.01  # how often a held process looks for its release (only ever while a test holds it)


def _name(key: str) -> str:
    return quote(key, safe="")


class Gates:
    """The process side: `hold`/`hold_sync` at a point; returns at once unless the test armed it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def from_env(cls) -> Gates | None:
        root = os.environ.get(ENV)
        return cls(Path(root)) if root else None

    def _matches(self, point: str, key: str) -> bool:
        try:
            pattern = (self.root / "armed" / point).read_text()
        except FileNotFoundError:
            return False
        return re.search(pattern, key) is not None

    def _announce(self, point: str, key: str) -> Path:
        held = self.root / "held" / point / _name(key)
        held.parent.mkdir(parents=True, exist_ok=True)
        held.write_text(str(os.getpid()))
        return self.root / "released" / point / _name(key)

    def _released(self, point: str, release: Path) -> bool:
        return release.exists() or not (self.root / "armed" / point).exists()

    async def hold(self, point: str, key: str) -> None:
        if not self._matches(point, key):
            return
        release = self._announce(point, key)
        while not self._released(point, release):
            await asyncio.sleep(HOLD_POLL_S)

    def hold_sync(self, point: str, key: str) -> None:
        if not self._matches(point, key):
            return
        release = self._announce(point, key)
        while not self._released(point, release):
            time.sleep(HOLD_POLL_S)


class GateControl:
    """The test side of the same folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def env(self) -> dict[str, str]:
        return {ENV: str(self.root)}

    def arm(self, point: str, pattern: str) -> None:
        re.compile(pattern)  # a typo in a test's pattern fails here, not as a gate that never matches
        armed = self.root / "armed" / point
        armed.parent.mkdir(parents=True, exist_ok=True)
        armed.write_text(pattern)

    def disarm(self, point: str) -> None:
        """Release everything held at `point`; later keys pass."""
        (self.root / "armed" / point).unlink(missing_ok=True)

    def release(self, point: str, key: str) -> None:
        path = self.root / "released" / point / _name(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def held(self, point: str) -> list[str]:
        """Keys that reached `point` while it was armed (held now, or released since), sorted."""
        folder = self.root / "held" / point
        return sorted(unquote(p.name) for p in folder.iterdir()) if folder.is_dir() else []

    def holder(self, point: str, key: str) -> int:
        """The pid of the process that reached `point` with `key` (to signal that very process)."""
        return int((self.root / "held" / point / _name(key)).read_text())

    def clear(self, point: str) -> None:
        """Forget what was held and released at `point` (between tests sharing one folder)."""
        self.disarm(point)
        for sub in ("held", "released"):
            folder = self.root / sub / point
            if folder.is_dir():
                for p in folder.iterdir():
                    p.unlink()


class GatedStore:
    """An object store whose writes (`put`, `put_if_absent`) hold at point `store_before_put` before
    writing and at `store_put` after writing (key = object key)."""

    def __init__(self, store, gates: Gates) -> None:
        self._store = store
        self._gates = gates

    def put(self, key: str, data: bytes) -> None:
        self._gates.hold_sync("store_before_put", key)
        self._store.put(key, data)
        self._gates.hold_sync("store_put", key)

    def put_if_absent(self, key: str, data: bytes):
        # the wrapped store's own put_if_absent calls its own put, which would bypass the gates
        self._gates.hold_sync("store_before_put", key)
        outcome = self._store.put_if_absent(key, data)
        self._gates.hold_sync("store_put", key)
        return outcome

    def __getattr__(self, name: str):
        return getattr(self._store, name)
