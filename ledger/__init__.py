"""The episode ledger: the pure state machine an EpisodeWorkflow holds (no I/O, no clocks, no Temporal).

    ledger.ledger           `Ledger`: one model joined from the rules below; what the workflow calls
    ledger.state            what the ledger holds and the lookups every rule reads
    ledger.errors           one typed error per rule a call or a context can break
    ledger.context_opening  opening a context: ROOT, SPAWN and REWRITE, ownership, rewrite lineage
    ledger.call_admission   where in its context a new model call may start
    ledger.call_lifecycle   a call after admission: completion and the state it ends in
    ledger.delivery         which responses reached their harness (deliver, discard)
    ledger.ancestry         which completed call a new prompt extends, from digests
    ledger.settlement       how calls leave the live ledger: at a hand-over and at the close
    ledger.settled          what the ledger keeps of calls it has settled
    ledger.handover         snapshot pages of a long episode's ledger, split and joined
    ledger.accounting       counts per state and the closing record
    ledger.context_view     what one gateway request needs to know: the contexts it may route to
    ledger.report           what the ledger tells its readers: summaries, roots, last outputs

Below workflows/ (which holds it in an EpisodeWorkflow) and gateway/ (which reads its context view),
above only the vocabulary in grove/.
"""
