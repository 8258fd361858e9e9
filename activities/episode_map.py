"""The map of a closed episode: every context with its agent, origin links (spawned by which call, rewrite
of which context, retired by which) and its calls per final state, one JSON line per context, written
with the episode's rows by the materialize activity (grove/store_layout.py `contexts_key`).

Why a store object: at the close the episode's ledger pages are cleaned and the workflow's `summary`
query is a running episode's (and answers one page at a time); `grove episode show` of a closed episode
reads its contexts from here, in opening order, whatever their number (its size is the episode's, and it
never crosses Temporal). Written with `put_if_absent`: a retried materialize writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from grove.receipts import CallReceipt, ContextRecord
from ledger.accounting import ContextSummary, count_states
from ledger.ledger import Ledger


def ledger_contexts(ledger: Ledger) -> Iterator[ContextSummary]:
    """Each context of a closed ledger as the summary shows it (settled calls counted), opening order."""
    return (ledger.context_summary(context_id) for context_id in ledger.contexts)


def record_contexts(
    records: Iterable[ContextRecord], receipts: Iterable[CallReceipt]
) -> list[ContextSummary]:
    """Each context of a closed ledger that travelled inline (its records and final receipts)."""
    records = list(records)
    by_context: dict[str, list[CallReceipt]] = {r.context_id: [] for r in records}
    for receipt in receipts:
        by_context.setdefault(receipt.context_id, []).append(receipt)
    retired = {r.rewrite_of: r.context_id for r in records if r.rewrite_of is not None}
    return [
        ContextSummary(
            context_id=r.context_id,
            agent=r.agent,
            origin=r.origin,
            spawned_by_call=r.spawned_by_call,
            rewrite_of=r.rewrite_of,
            retired_by=retired.get(r.context_id),
            head=None,
            counts=count_states(by_context[r.context_id]),
            pending=[],
        )  # fmt: skip
        for r in records
    ]


def encode_contexts(contexts: Iterable[ContextSummary]) -> bytes:
    return b"".join(c.model_dump_json().encode() + b"\n" for c in contexts)


def decode_contexts(data: bytes) -> list[ContextSummary]:
    return [ContextSummary.model_validate_json(line) for line in data.splitlines() if line.strip()]
