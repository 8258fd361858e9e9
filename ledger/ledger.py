"""The episode ledger: the workflow state that admits, tracks and accounts for every model call (pure).

An `EpisodeWorkflow` holds one `Ledger`. Agents open *contexts*: the root agent's first context, a
worker's context spawned by a named call of another agent, or a declared rewrite (compaction) of the
agent's own current context, which retires the old one (ledger/context_opening.py). Within a context a
call extends the context's head, or branches from an older completed call; only a context's first live
call extends nothing (ledger/call_admission.py). Calls move admitted -> completed -> selected, auxiliary or
discarded, or straight from admitted to failed, cancelled or discarded (a lost attempt); each ends in
exactly one terminal state (ledger/call_lifecycle.py, grove/receipts.py `CallState`); only a delivered
response counts (ledger/delivery.py).
`close()` resolves completed calls to selected/auxiliary and returns an accounting record in which every
admitted call id appears in exactly one terminal state; a long episode's hand-over settles the calls
older than its branch window (ledger/settlement.py). The queries read ledger/report.py.

One class, built from those concepts over one state (ledger/state.py), so the workflow holds,
serialises and hands over a single pydantic model. Every rule violation raises a `LedgerError` subclass
(ledger/errors.py) carrying episode id, context id, call ids, what was expected and what to do.
`validate_*` methods raise the same errors without mutating (Temporal Update validators call them).
Repeating a transition that already happened with the same data is a no-op, so retried Updates are
harmless.

Pure module: pydantic + stdlib only (imported inside the Temporal workflow sandbox).
"""

from __future__ import annotations

from ledger.call_admission import CallAdmission
from ledger.call_lifecycle import CallLifecycle
from ledger.context_opening import ContextOpening
from ledger.errors import LedgerError
from ledger.report import LedgerReport
from ledger.settlement import Settlement
from ledger.state import ContextState

# ContextState and LedgerError are also importable from here for the workflow code of past commits that
# tests/workflows/record_histories.py runs against today's modules to record replay histories (that code
# cannot change); new code imports them from their own modules.
__all__ = ["ContextState", "Ledger", "LedgerError"]


class Ledger(ContextOpening, CallAdmission, CallLifecycle, Settlement, LedgerReport):
    """Workflow state of one episode. See the module docstring for the rules."""
