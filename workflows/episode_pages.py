"""An episode's ledger pages as its workflow keeps them: written, restored, settled (Temporal workflow code).

A ledger too large for one payload (more than `spec.ledger_page_items` contexts + calls), or settled at an
earlier hand-over, travels as snapshot pages (the pure splitting and joining is ledger/handover.py).
`LedgerPages` is the workflow's side of that:

- it remembers what the pages written so far hold, so a later write holds only what changed since
  (`store`);
- at a hand-over (`hand_over`) the ledger goes into the next run's carry: inline when small, else as
  pages; patched in (`grove-settle-calls`, decided by the workflow), the pages are listed in this run's
  `LedgerIndex` (a chain in the store, one link per hand-over), every call older than its context's
  branch window is settled (ledger/settlement.py) and only the live ledger is carried, inline or as
  pages of its own when it is too large for a payload. Runs recorded before the patch hand the whole
  ledger over as pages and replay as they ran;
- before the close (`before_close`) a paged ledger writes what changed (this run's calls): materialize
  applies the close to the joined pages, so the settlement of every call never goes through the history;
- a run that starts from pages restores them (`restore`) one page per workflow task, the next load
  scheduled while this page is unpacked (patched in: `grove-restore-by-page`; restores recorded before
  load every page at once). Update handlers wait for the restore.

Page keys are deterministic per (episode, run, purpose, index), so a retried write finds its own bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow

from grove.contracts import RestoreProgress
from grove.receipts import CallReceipt
from grove.store_layout import ledger_index_key, ledger_page_key
from ledger.handover import (
    EpisodeCarry,
    EpisodeRun,
    LedgerIndex,
    LedgerPage,
    apply_page,
    changed_pages,
    ledger_items,
    pack_page,
    split_pages,
    unpack_page,
)
from ledger.ledger import Ledger
from ledger.state import ContextState
from workflows.episode_activities import io_activity


class LedgerPages:
    """What the written pages of one episode's ledger hold, and the writes and loads of those pages."""

    def __init__(self, spec: EpisodeRun, ledger: Ledger) -> None:
        self.spec = spec
        carry = spec.carry
        self.run_index = carry.run_index if carry else 0
        # What the pages written so far hold: a later save writes only what changed since.
        self.saved_pages: list[str] = list(carry.ledger_pages) if carry else []
        self.saved_contexts: dict[str, ContextState] = {}
        self.saved_calls: dict[str, CallReceipt] = {}
        # settled episodes: the pages of the earlier runs, as a chain of indexes in the store
        self.index: str | None = carry.ledger_index if carry else None
        self.restore_progress: RestoreProgress | None = None  # a paged ledger's restore (progress query)
        if carry is not None and carry.settled:
            self.mark_saved(ledger)  # the carried live calls were written to the pages before the settle

    def paged(self, ledger: Ledger) -> bool:
        """The ledger travels as pages: too large for a payload, or settled before (its pages are then
        the only record of its settled calls). Before the settle patch, pages meant the first."""
        return (
            bool(self.saved_pages)
            or self.index is not None
            or ledger_items(ledger) > self.spec.ledger_page_items
        )

    def mark_saved(self, ledger: Ledger) -> None:
        """The ledger as it is now is what the written pages hold."""
        self.saved_contexts = {k: v.model_copy(deep=True) for k, v in ledger.contexts.items()}
        self.saved_calls = dict(ledger.calls)

    async def store(self, ledger: Ledger, purpose: str) -> list[str]:
        """All page keys of the ledger: those written before, plus pages of what changed since."""
        eid = self.spec.episode_id
        size = self.spec.ledger_page_items
        pages = changed_pages(ledger, self.saved_contexts, self.saved_calls, size)
        keys = [ledger_page_key(eid, self.run_index, purpose, i) for i in range(len(pages))]
        await self._write(keys, pages)
        return self.saved_pages + keys

    async def before_close(self, ledger: Ledger) -> list[str] | None:
        """A ledger too large for a payload is paged *before* its close (only what changed since the
        last pages: this run's calls); materialize applies the close (MaterializeInput.close_reason).
        Paged after the close, the settlement of every call of the episode went through the history."""
        if not self.paged(ledger):
            return None
        return await self.store(ledger, "final")

    async def hand_over(
        self, ledger: Ledger, carry: EpisodeCarry, closing: Callable[[], bool], settles: Callable[[], bool]
    ) -> None:
        """Put the ledger into the next run's carry. `closing`: a close was accepted meanwhile (the
        episode then finishes in this run, and nothing more is written); `settles`: the run settles its
        paged ledger (the workflow's patch decision, asked only once the pages are written)."""
        if closing() or not self.paged(ledger):
            carry.ledger = ledger
            return
        pages = await self.store(ledger, "handover")
        if not closing() and settles():
            await self._settle(ledger, carry, pages)
        else:
            carry.ledger_pages = pages

    async def _settle(self, ledger: Ledger, carry: EpisodeCarry, pages: list[str]) -> None:
        """After the pages are written: list them in this run's index (the chain materialize follows),
        drop the settled calls and carry the live ledger, inline, or as pages of its own when too large
        for a payload (many contexts). The next run restores only that: no page list, no settled call."""
        key = ledger_index_key(self.spec.episode_id, self.run_index)
        await io_activity("store_ledger_index", key, None, LedgerIndex(previous=self.index, pages=pages))
        self.index, self.saved_pages = key, []
        ledger.settle(self.spec.branch_window)
        self.mark_saved(ledger)
        carry.settled = True
        carry.ledger_index = key
        size = self.spec.ledger_page_items
        if ledger_items(ledger) <= size:
            carry.ledger = ledger
            return
        live = split_pages(ledger, size)
        keys = [ledger_page_key(self.spec.episode_id, self.run_index, "live", i) for i in range(len(live))]
        await self._write(keys, live)
        carry.ledger = ledger.model_copy(update={"contexts": {}, "calls": {}})
        carry.live_pages = keys

    async def _write(self, keys: list[str], pages: list[LedgerPage]) -> None:
        await asyncio.gather(
            *(
                io_activity("store_ledger_page", k, None, pack_page(p))
                for k, p in zip(keys, pages, strict=True)
            )
        )

    async def restore(self, ledger: Ledger) -> Ledger:
        """The ledger of the carried pages, restored one page per workflow task: the pages load one after
        another (the next load is scheduled while this page is unpacked), so each activation delivers one
        load and unpacks one page; unpacking every page in one task can run past Temporal's deadlock
        detector on a loaded worker. Patched in: restores recorded before replay as they ran (every page
        at once, joined into `ledger`)."""
        carry = self.spec.carry
        assert carry is not None
        keys = carry.restore_pages()
        progress = self.restore_progress = RestoreProgress(pages_total=len(keys))
        if not workflow.patched("grove-restore-by-page"):
            packed = await asyncio.gather(*(io_activity("load_ledger_page", k, bytes) for k in keys))
            for data in packed:
                progress = self._restore_page(unpack_page(data), ledger, progress)
            return ledger
        if carry.settled:  # the live calls' pages join onto the carried tails
            assert carry.ledger is not None
            restored = carry.ledger.model_copy(deep=True)
        else:
            restored = Ledger(episode_id=self.spec.episode_id, group_id=self.spec.group_id)
        loading = asyncio.ensure_future(io_activity("load_ledger_page", keys[0], bytes))
        for i in range(len(keys)):
            data = await loading
            if i + 1 < len(keys):
                loading = asyncio.ensure_future(io_activity("load_ledger_page", keys[i + 1], bytes))
            progress = self._restore_page(unpack_page(data), restored, progress)
        return restored

    def _restore_page(self, page: LedgerPage, ledger: Ledger, progress: RestoreProgress) -> RestoreProgress:
        """Join one page into the ledger being restored and into what the written pages hold."""
        apply_page(ledger, page)
        self.saved_contexts.update({k: v.model_copy(deep=True) for k, v in page.contexts.items()})
        self.saved_calls.update(page.calls)
        self.restore_progress = progress.page_done(workflow.info().get_current_history_length())
        return self.restore_progress
