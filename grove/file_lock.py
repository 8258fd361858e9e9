"""An exclusive lock on a file, across processes: the model cache's builds, OpenCode's install, the
local stack's up/down.

flock is released by the kernel when its holder dies, so a crashed holder never wedges the next one.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: Path, on_wait: Callable[[Path], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created, with its folder, if missing) for the block; when another
    process holds it, call `on_wait(path)` once (the wait is silent otherwise), then wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
