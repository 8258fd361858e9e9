"""Splitting an episode's ledger into snapshot pages and joining them again (pure).

A long episode continues-as-new (workflows/episode.py) and hands its ledger to the next run. A ledger
of thousands of calls is larger than one Temporal payload (2 MB), so it travels through the object
store as pages of at most `EpisodeSpec.ledger_page_items` contexts + calls (default 1,000: ~0.5 MB of
JSON); the workflow carries
only the pages' keys. Page keys are deterministic per (episode, run, purpose, index), so a retried
write finds its own bytes.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from grove.contracts import LedgerPage
from workflows.ledger import Ledger

LEDGER_ROOT = "ledger"


def ledger_prefix(episode_id: str) -> str:
    return f"{LEDGER_ROOT}/{episode_id}/"


def page_key(episode_id: str, run_index: int, purpose: str, index: int) -> str:
    return f"{ledger_prefix(episode_id)}run-{run_index:05d}/{purpose}/page-{index:05d}.json"


def ledger_items(ledger: Ledger) -> int:
    return len(ledger.contexts) + len(ledger.calls)


def split_pages(ledger: Ledger, max_items: int) -> list[LedgerPage]:
    """Contexts then calls, in their (admission) order, cut into pages of at most `max_items`."""
    pages: list[LedgerPage] = []
    page = LedgerPage()
    for kind, items in (("contexts", ledger.contexts), ("calls", ledger.calls)):
        for key, value in items.items():
            if len(page.contexts) + len(page.calls) >= max_items:
                pages.append(page)
                page = LedgerPage()
            getattr(page, kind)[key] = value
    pages.append(page)
    return pages


def join_pages(episode_id: str, group_id: str, pages: Iterable[LedgerPage], **state) -> Ledger:
    """The ledger whose split_pages were `pages` (order kept: dicts keep insertion order)."""
    ledger = Ledger(episode_id=episode_id, group_id=group_id, **state)
    for page in pages:
        ledger.contexts.update(page.contexts)
        ledger.calls.update(page.calls)
    return ledger
