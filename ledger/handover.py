"""Splitting an episode's ledger into snapshot pages and joining them again (pure).

A long episode continues-as-new (workflows/episode.py) and hands its ledger to the next run. A ledger
of thousands of calls is larger than one Temporal payload (2 MB), so it travels through the object
store as pages of at most `EpisodeSpec.ledger_page_items` contexts + calls (default 1,000); the
workflow carries only the pages' keys. Page keys are deterministic per (episode, run, purpose, index)
(grove/store_layout.py `ledger_page_key`), so a retried write finds its own bytes.

Pages are incremental: a run writes only the contexts and calls that changed since the pages it was
restored from (`changed_pages`), and a ledger is the pages of all runs joined in order, later pages
overriding earlier ones (`join_pages`). Each run's history thus carries the calls of that run once
on the way out. On the way in (under the `grove-settle-calls` patch) only the live ledger: after writing
its pages the run settles every call older than its context's branch window (ledger/settlement.py
`settle`), lists its pages in a `LedgerIndex` (a chain in the store, one link per hand-over) and carries
the live calls and the settled tails, so what a run restores is bounded by the live calls, not by the
episode's length. The materialize activity joins every page of the chain. A run whose history lacks the
patch carries the whole ledger as pages (`ledger_pages`) and its successor loads every page.

Pages cross Temporal packed (`pack_page`: zlib-compressed JSON, a raw bytes payload, several times
smaller: docs/results.md section 3.5), and sit in the store as plain JSON. A settled run loads only
its live ledger: inline in its carry, or as the live calls' own pages (`live_pages`) when they are too
many for a payload, never the pages of the earlier runs; what it loads grows with the live calls, not
with the episode's length. The close writes no call again: the ledger is paged before its close and the
materialize activity applies the close (`MaterializeInput.close_reason`).

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from pydantic import BaseModel, Field

from grove.contracts import EpisodeSpec
from grove.receipts import CallReceipt
from ledger.ledger import Ledger
from ledger.state import ContextState


class LedgerPage(BaseModel):
    """One page of a ledger snapshot in the object store (a ledger too large for one payload)."""

    contexts: dict[str, ContextState] = Field(default_factory=dict)
    calls: dict[str, CallReceipt] = Field(default_factory=dict)


class EpisodeCarry(BaseModel):
    """What an episode's next workflow run needs: its ledger (inline when small, else the keys of
    its snapshot pages in the object store) and counters for the UI.

    `settled` (patched in, `grove-settle-calls`): the previous run wrote its pages and settled its
    ledger (ledger/settlement.py `settle`): every page of the episode is listed by the `ledger_index`
    chain, for the materialize activity only; the run restores `ledger` (its live calls and the settled
    tails), plus `live_pages` when the live calls are too many for a payload (`ledger` then holds none
    of them). What a run restores is then bounded by the live calls, not by the episode's length."""

    run_index: int = Field(ge=1)  # 0 is the first run; this is the index of the run that starts
    ledger: Ledger | None = None
    ledger_pages: list[str] = Field(default_factory=list)
    updates_before: int = Field(0, ge=0)  # Updates handled by the earlier runs
    settled: bool = False
    live_pages: list[str] = Field(default_factory=list)
    # settled: the keys of the pages of the earlier runs are in the store, a chain of LedgerIndex
    # objects (one per hand-over), so the carry does not grow with the episode's hand-overs either
    ledger_index: str | None = None

    def restore_pages(self) -> list[str]:
        """The pages the run loads before it admits anything."""
        return self.live_pages if self.settled else self.ledger_pages


class LedgerIndex(BaseModel):
    """The pages one run of a settled episode wrote (or every page before it, at the first settle), and
    the index of the runs before it: the materialize activity follows the chain to the first run."""

    previous: str | None = None
    pages: list[str] = Field(default_factory=list)


class EpisodeRun(EpisodeSpec):
    """The input of one workflow run of an episode: its spec, plus what the previous run handed over
    when it continued-as-new (None for the first run). The carry is the workflow's own state, so it is
    declared here beside the ledger and not in the spec that starters and harnesses share; a starter's
    EpisodeSpec arrives as an EpisodeRun without a carry."""

    carry: EpisodeCarry | None = None


PACK_LEVEL = 6  # zlib: level 9 saves < 1% more on receipts (sha256 hex dominates what is left)


def ledger_items(ledger: Ledger) -> int:
    return len(ledger.contexts) + len(ledger.calls)


def split_pages(ledger: Ledger, max_items: int) -> list[LedgerPage]:
    """Contexts then calls, in their (admission) order, cut into pages of at most `max_items`."""
    return _paged(ledger.contexts, ledger.calls, max_items)


def changed_pages(
    ledger: Ledger,
    saved_contexts: dict[str, ContextState],
    saved_calls: dict[str, CallReceipt],
    max_items: int,
) -> list[LedgerPage]:
    """Pages of what changed since `saved_*` (the state the pages already written hold); [] if nothing.

    Calls compare by identity: the ledger replaces a receipt on every transition (model_copy), never
    edits one in place. Contexts compare by value without their call lists (pages never hold them:
    `apply_page` rebuilds them from the calls), so a context is written again only when its
    reservation or retirement changes, not whenever it gets a call."""
    contexts = {k: v for k, v in ledger.contexts.items() if not _same_context(saved_contexts.get(k), v)}
    calls = {k: v for k, v in ledger.calls.items() if saved_calls.get(k) is not v}
    return _paged(contexts, calls, max_items) if contexts or calls else []


def _same_context(saved: ContextState | None, now: ContextState) -> bool:
    return saved is not None and saved.record == now.record and saved.retired_by == now.retired_by


def _paged(contexts: dict, calls: dict, max_items: int) -> list[LedgerPage]:
    """Contexts (without their call lists: every run rewrote a context's whole list, a share of the pages
    growing with the square of the hand-overs; docs/results.md section 3.6), then calls."""
    pages: list[LedgerPage] = []
    page = LedgerPage()
    for kind, items in (("contexts", contexts), ("calls", calls)):
        for key, value in items.items():
            if len(page.contexts) + len(page.calls) >= max_items:
                pages.append(page)
                page = LedgerPage()
            if kind == "contexts":
                value = value.model_copy(update={"call_ids": []})
            getattr(page, kind)[key] = value
    pages.append(page)
    return pages


def join_pages(episode_id: str, group_id: str, pages: Iterable[LedgerPage], **state) -> Ledger:
    """The ledger whose pages (split or changed, in writing order) are `pages`: a later page's entry
    replaces an earlier one in place, so admission order is kept."""
    ledger = Ledger(episode_id=episode_id, group_id=group_id, **state)
    for page in pages:
        apply_page(ledger, page)
    return ledger


def apply_page(ledger: Ledger, page: LedgerPage) -> None:
    """Join one more page into `ledger` (join_pages one page at a time: a restore that yields between
    pages keeps each workflow task's work bounded by one page, whatever the ledger's size).

    A context's call list is rebuilt from the calls: the ledger appends a call to its context's list
    exactly when it admits it (and admits an id once), so the list is the context's calls in admission
    order, which is the order of the joined calls. A page's own list (pages written before lists were
    left out) is ignored: the rebuilt one is the same. A context's page precedes its calls' pages."""
    for key, context in page.contexts.items():
        known = ledger.contexts.get(key)
        ledger.contexts[key] = context.model_copy(update={"call_ids": known.call_ids if known else []})
    for key, call in page.calls.items():
        if key not in ledger.calls:
            ledger.contexts[call.context_id].call_ids.append(key)
        ledger.calls[key] = call


def pack_page(page: LedgerPage) -> bytes:
    """A page as it crosses Temporal: compressed JSON (deterministic for one zlib build)."""
    return zlib.compress(page.model_dump_json().encode(), PACK_LEVEL)


def unpack_page(data: bytes) -> LedgerPage:
    return LedgerPage.model_validate_json(zlib.decompress(data))
