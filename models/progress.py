"""Progress of a model build: step, loss, elapsed time and ETA, every EVERY_STEPS steps or EVERY_S seconds
(whichever comes first) and at the last step; for a build of a few unequal steps without a loss (a
conversion), each step as it ends, named. To the `models` log and to every listener
(`listen_to_progress`): `grove model init` prints the lines, the test suite writes them past pytest's
capture (tests/fixtures/models.py), so a build of many minutes never looks like a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("models.progress")

EVERY_STEPS = 25
EVERY_S = 30.0
_listeners: list[Callable[[str], None]] = []


def listen_to_progress(listener: Callable[[str], None]) -> Callable[[], None]:
    """Call `listener` with every progress line of this process's builds; returns its remover."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class BuildProgress:
    """`report(step, loss)` after each of a build's `total` steps (0-based step numbers)."""

    def __init__(self, label: str, total: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.clock = label, total, clock
        self.started = self.last = clock()

    def line(self, step: int, loss: float) -> str:
        done = step + 1
        elapsed = self.clock() - self.started
        eta = elapsed / done * (self.total - done)
        return (
            f"{self.label}: step {done}/{self.total} loss {loss:.4f}, {_duration(elapsed)} elapsed, "
            f"ETA {_duration(eta)}"
        )

    def report(self, step: int, loss: float) -> None:
        now = self.clock()
        if not (step % EVERY_STEPS == 0 or step == self.total - 1 or now - self.last >= EVERY_S):
            return
        self.last = now
        self._say(self.line(step, loss))

    def done(self, step: int, what: str) -> None:
        """Step `step` (0-based), which did `what`, has ended: always said, ETA from the mean step so far."""
        done = step + 1
        elapsed = self.clock() - self.started
        eta = elapsed / done * (self.total - done)
        self.last = self.clock()
        times = f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}"
        self._say(f"{self.label}: step {done}/{self.total} {what}, {times}")

    def _say(self, text: str) -> None:
        log.info(text)
        for listener in list(_listeners):
            listener(text)
