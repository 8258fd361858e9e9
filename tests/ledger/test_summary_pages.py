"""The `summary` query answers in pages (ledger/report.py, ledger/accounting.py SummaryPage):
one answer holds at most SUMMARY_PAGE_CONTEXTS contexts and MAX_WARNINGS warnings, so it stays far below
Temporal's 2 MB payload limit however many contexts an episode opens, and paging with `next_offset`
reads every context once, in opening order. Real ledgers of 5,000 stray root agents (each a warning)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ledger.accounting import MAX_WARNINGS, SUMMARY_PAGE_CONTEXTS, SummaryPage
from tests.ledger.test_context_view import episode

TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024


def test_one_answer_stays_bounded_and_the_pages_hold_every_context_once():
    ep = episode(others=5000)
    opened = list(ep.ledger.contexts)
    page = SummaryPage()
    first = ep.ledger.summary(page.offset, page.limit)
    assert len(first.model_dump_json()) < TEMPORAL_PAYLOAD_LIMIT / 4
    assert first.context_count == len(opened) == 5006
    assert len(first.warnings) == MAX_WARNINGS + 1 and first.warnings[-1].startswith("... and 4980 more")
    seen, offset = [], 0
    while offset is not None:
        answer = ep.ledger.summary(offset, SUMMARY_PAGE_CONTEXTS)
        assert len(answer.contexts) <= SUMMARY_PAGE_CONTEXTS
        assert answer.totals == first.totals  # the totals are the whole episode's on every page
        seen += [c.context_id for c in answer.contexts]
        offset = answer.next_offset
    assert seen == opened


def test_a_small_episode_is_one_page_and_a_page_is_never_larger_than_the_bound():
    ep = episode(others=3)
    whole = ep.ledger.summary(0, SUMMARY_PAGE_CONTEXTS)
    assert whole.next_offset is None and len(whole.contexts) == whole.context_count == 9
    assert whole == ep.ledger.summary()  # all contexts: the same answer
    with pytest.raises(ValidationError):
        SummaryPage(limit=SUMMARY_PAGE_CONTEXTS + 1)
    with pytest.raises(ValidationError):
        SummaryPage(offset=-1)
