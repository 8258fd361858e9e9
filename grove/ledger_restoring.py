"""An episode's ledger queries answer `LedgerRestoring` while its pages load, and whoever asks waits.

A continued-as-new episode run whose ledger was handed over as pages (ledger/handover.py) loads them
before anything else (workflows/episode_pages.py `restore`). Its Updates wait for the whole ledger; a
query cannot wait (Temporal answers it at once from the workflow's state), and an answer from the part
loaded so far would be wrong: a context not loaded yet reads as absent, and a gateway planning a request
from that view opens the context a second time (refused after the restore: 409 DuplicateContextError).

So the queries that read the ledger (`summary`, `context_view`, `delivery_refusal`, `call_states`) fail
while the restore runs, with a message that starts with `LedgerRestoring:` (a failed query carries only
its message) and names the pages loaded so far; `status` and `progress` answer as always (`progress`
shows the restore). Whoever asks recognises the answer (`is_restoring`) and asks again with backoff
(`ask_while_restoring`) within a bound: the gateway (gateway/temporal/episode_client.py, then 503
`LedgerRestoringError`) and `grove episode show` (`--wait`, then exit code 7).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

LEDGER_RESTORING = "LedgerRestoring"  # the failure type, and the head of a refused query's message
RESTORE_PATIENCE_S = 300.0  # how long the gateway asks again (a long episode's restore takes minutes)
FIRST_DELAY = 0.05
MAX_DELAY = 1.0


def restoring_message(episode_id: str, query: str, pages_done: int | None, pages_total: int | None) -> str:
    """The refusal of a ledger query during the restore: `LedgerRestoring: ...` (is_restoring)."""
    pages = "" if pages_total is None else f" ({pages_done or 0} of {pages_total} pages loaded)"
    return (
        f"{LEDGER_RESTORING}: episode {episode_id!r} is restoring its ledger from pages{pages}, so the "
        f"{query} query would answer from part of it; ask again once the restore is done (the progress "
        "query shows it)"
    )


def is_restoring(message: str) -> bool:
    """Whether a failed query's message is the restore's refusal (restoring_message)."""
    return message.startswith(f"{LEDGER_RESTORING}:")


async def ask_while_restoring(
    ask: Callable[[], Awaitable[T]],
    restoring: Callable[[BaseException], bool],
    *,
    patience: float = RESTORE_PATIENCE_S,
    on_wait: Callable[[BaseException], None] | None = None,
) -> T:
    """`ask()`, asked again while it fails with an error `restoring` recognises, backing off from
    FIRST_DELAY to MAX_DELAY, for `patience` seconds at most: then that error is raised. Any other
    error is raised at once. `on_wait` sees each refusal that is waited out."""
    deadline = time.monotonic() + patience
    delay = FIRST_DELAY
    while True:
        try:
            return await ask()
        except Exception as err:
            if not restoring(err) or time.monotonic() + delay > deadline:
                raise
            if on_wait is not None:
                on_wait(err)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
