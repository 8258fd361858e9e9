"""Ledger behaviour: lines and heads, transitions, close, accounting, queries, serialisation, ancestry."""

from __future__ import annotations

import numpy as np
import pytest

from grove.receipts import CallKind, CallState
from ledger.accounting import IncompleteAccountingError, LedgerAccounting
from ledger.ancestry import ancestry_evidence
from ledger.call_admission import AdmitRequest
from ledger.errors import StaleContinuationError
from ledger.ledger import Ledger
from tests.forest.kit import Episode, tokens


def chain() -> Episode:
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3], [-1]))
    ep.call("c2", "a", tokens([1, 2, 3, 4], [5, 6], [-2, -3]), extends="c1")
    return ep


def test_head_moves_with_admissions_and_falls_back_when_the_head_is_discarded():
    ep = chain()
    assert ep.ledger.head("a") == "c2"
    ep.ledger.discard("c2", "retry")
    assert ep.ledger.head("a") == "c1"
    ep.admit("c2r", "a", "c1")  # the retry now extends the head
    assert ep.ledger.head("a") == "c2r"


def test_a_branch_becomes_the_head_and_discarding_it_restores_the_previous_head():
    ep = chain()
    ep.call("b2", "a", tokens([1, 2, 3, 9], [8], [-1]), extends="c1", branch=True)
    assert ep.ledger.head("a") == "b2"
    with pytest.raises(StaleContinuationError):
        ep.admit("c3", "a", "c2")
    ep.ledger.discard("b2", "abandoned fork")
    assert ep.ledger.head("a") == "c2"


def test_branches_may_be_outstanding_together():
    ep = chain()
    for i in range(3):  # best-of-3 resampling from c1 at once
        ep.admit(f"s{i}", "a", "c1", branch=True)
    assert ep.ledger.summary().contexts[0].pending == ["s0", "s1", "s2"]


def test_validate_admit_never_mutates():
    ep = chain()
    before = ep.ledger.model_dump()
    ep.ledger.validate_admit("c3", "a", extends="c2")
    with pytest.raises(StaleContinuationError):
        ep.ledger.validate_admit("c3", "a", extends="c1")
    assert ep.ledger.model_dump() == before


def test_admit_request_model_matches_admit():
    ep = chain()
    request = AdmitRequest(call_id="c3", context_id="a", extends="c2", kind=CallKind.AUXILIARY)
    ep.ledger.validate_admit_request(request)
    receipt = ep.ledger.admit_request(request)
    assert (receipt.call_id, receipt.agent, receipt.kind, receipt.parent_call_id, receipt.state) == (
        "c3",
        "parent",
        CallKind.AUXILIARY,
        "c2",
        CallState.ADMITTED,
    )


def test_repeating_a_transition_with_the_same_data_is_a_no_op():
    ep = chain()
    arrays = tokens([1, 2, 3, 4, 5, 6, 7], [8], [-4])
    ep.admit("c3", "a", "c2")
    first = ep.complete("c3", arrays)
    assert ep.complete("c3", arrays) == first
    ep.admit("c4", "a", "c3")
    ep.ledger.fail("c4", "engine error")
    assert ep.ledger.fail("c4", "engine error").state == CallState.FAILED


def test_close_settles_every_call_and_is_idempotent():
    ep = chain()
    ep.root("t", "title")
    ep.call("t1", "t", tokens([9], [9], [-1]), kind=CallKind.AUXILIARY)
    ep.spawn("w", "worker-1", by="c2")
    ep.admit("w1", "w")
    acc = ep.close(cancel_outstanding=True)
    assert acc.by_state[CallState.SELECTED] == ["c1", "c2"]
    assert acc.by_state[CallState.AUXILIARY] == ["t1"]
    assert acc.by_state[CallState.CANCELLED] == ["w1"] and acc.cancelled_at_close == ["w1"]
    assert acc.by_state[CallState.ADMITTED] == [] and acc.by_state[CallState.COMPLETED] == []
    assert acc.per_context == {
        "a": {**dict.fromkeys(CallState, 0), CallState.SELECTED: 2},
        "t": {**dict.fromkeys(CallState, 0), CallState.AUXILIARY: 1},
        "w": {**dict.fromkeys(CallState, 0), CallState.CANCELLED: 1},
    }
    assert ep.close() == acc


def test_summary_counts_per_context_and_in_total():
    ep = chain()
    ep.spawn("w", "worker-1", by="c2")
    ep.admit("w1", "w")
    ep.admit("c3", "a", "c2")
    ep.ledger.fail("c3", "timeout")
    summary = ep.ledger.summary()
    assert summary.totals == {**dict.fromkeys(CallState, 0), "completed": 2, "admitted": 1, "failed": 1}
    by_ctx = {c.context_id: c for c in summary.contexts}
    assert by_ctx["a"].counts[CallState.COMPLETED] == 2 and by_ctx["a"].counts[CallState.FAILED] == 1
    assert by_ctx["a"].head == "c2" and by_ctx["a"].pending == []
    assert by_ctx["w"].pending == ["w1"] and by_ctx["w"].origin == "spawn"


def test_summary_shows_each_contexts_origin_links():
    """Who spawned a worker and which context a rewrite replaced are in the query answer, not only in
    the workflow history."""
    ep = chain()
    ep.spawn("w", "worker-1", by="c2")
    ep.rewrite("a2", "parent", of="a")
    links = {
        c.context_id: (c.origin, c.spawned_by_call, c.rewrite_of, c.retired_by)
        for c in ep.ledger.summary().contexts
    }
    assert links == {
        "a": ("root", None, None, "a2"),
        "w": ("spawn", "c2", None, None),
        "a2": ("rewrite", None, "a", None),
    }


def test_summary_warns_about_agents_opened_without_a_spawner():
    """A second root agent that holds policy actions is most likely a worker whose harness did not
    name its spawner: the summary says so and names the header. Auxiliary-only roots are not agents."""
    ep = chain()
    assert ep.ledger.summary().warnings == []
    ep.root("t", "parent~title")
    ep.call("t1", "t", tokens([7], [8], [-1]), kind=CallKind.AUXILIARY)
    ep.spawn("w", "worker-1", by="c2")
    ep.call("w1", "w", tokens([5], [6], [-1]))
    ep.root("x", "helper")
    assert ep.ledger.summary().warnings == []  # no call yet: nothing it did is trained
    ep.call("x1", "x", tokens([5], [6], [-1]))
    [warning] = ep.ledger.summary().warnings
    assert "'helper' has no spawner" in warning and "x-grove-spawned-by" in warning and "'parent'" in warning


def test_ledger_round_trips_through_json_and_keeps_working():
    ep = chain()
    ep.spawn("w", "worker-1", by="c2")
    ep.admit("w1", "w")
    restored = Ledger.model_validate_json(ep.ledger.model_dump_json())
    assert restored == ep.ledger
    restored.complete("w1", "k", tokens([5], [6], [-1]).digests(), 2)
    assert restored.close().by_state[CallState.SELECTED] == ["c1", "c2", "w1"]


def test_ledger_state_holds_no_token_arrays():
    ep = chain()
    dumped = ep.ledger.model_dump_json()
    assert len(dumped) < 3000  # two calls: ids, lengths, digests only
    assert "prompt_ids" not in dumped


def test_resolve_extends_picks_the_longest_matching_completed_call():
    ep = chain()
    ranges = ep.ledger.ancestry_ranges("a")
    assert ranges == [(0, 2), (0, 4), (2, 3), (4, 6)]
    assert ep.ledger.resolve_extends("a", ancestry_evidence([1, 2, 3, 4, 5, 6, 7], ranges)) == "c2"
    assert ep.ledger.resolve_extends("a", ancestry_evidence([1, 2, 3, 9, 9], ranges)) == "c1"
    assert ep.ledger.resolve_extends("a", ancestry_evidence([1, 9, 9, 9, 9, 9], ranges)) is None


def test_resolve_extends_ignores_discarded_calls():
    ep = chain()
    ep.ledger.discard("c2", "retry")
    ranges = ep.ledger.ancestry_ranges("a")
    assert ep.ledger.resolve_extends("a", ancestry_evidence([1, 2, 3, 4, 5, 6, 7], ranges)) == "c1"


def test_accounting_check_rejects_a_call_in_no_terminal_state():
    acc = LedgerAccounting(
        episode_id="ep",
        group_id="g",
        admitted=["c1", "c2"],
        by_state={CallState.SELECTED: ["c1"], CallState.ADMITTED: ["c2"]},
        per_context={},
    )
    with pytest.raises(IncompleteAccountingError, match="c2"):
        acc.check_complete()


def test_accounting_check_rejects_a_call_in_two_states():
    acc = LedgerAccounting(
        episode_id="ep",
        group_id="g",
        admitted=["c1"],
        by_state={CallState.SELECTED: ["c1"], CallState.DISCARDED: ["c1"]},
        per_context={},
    )
    with pytest.raises(IncompleteAccountingError, match="c1"):
        acc.check_complete()


def test_a_lost_attempt_is_abandoned_as_discarded_and_retried_under_a_new_id():
    ep = chain()
    ep.admit("c3", "a", "c2")
    ep.ledger.abandon("c3", "lost attempt: heartbeat timeout")
    assert ep.ledger.calls["c3"].state == CallState.DISCARDED and ep.ledger.head("a") == "c2"
    ep.call("c3.r1", "a", tokens([1, 2, 3, 4, 5, 6, 7], [8], [-4]), extends="c2")
    acc = ep.close()
    assert acc.by_state[CallState.DISCARDED] == ["c3"]
    assert acc.by_state[CallState.SELECTED] == ["c1", "c2", "c3.r1"]
    assert "c3" not in ep.staged  # a lost attempt has no arrays, and needs none
    (row,) = ep.reconstruct().rows
    assert row.row_id == "ep#c3.r1" and row.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_lost_first_call_of_a_context_is_retried_as_the_root():
    ep = Episode()
    ep.root("a", "parent")
    ep.admit("c1", "a")
    ep.ledger.abandon("c1", "lost attempt")
    ep.call("c1.r1", "a", tokens([1, 2], [3], [-1]))
    assert ep.close().by_state[CallState.SELECTED] == ["c1.r1"]


def test_ancestry_evidence_hashes_like_the_staging_digests_for_numpy_and_list_prompts():
    staged = tokens([5, 6, 70_000, -1], [], []).digests()
    for prompt in ([5, 6, 70_000, -1, 9], np.asarray([5, 6, 70_000, -1, 9], dtype=np.int32)):
        evidence = ancestry_evidence(prompt, [(0, 4), (0, 9)])  # (0, 9) is past the end: skipped
        assert evidence.prompt_len == 5
        assert [(s.start, s.end, s.sha256) for s in evidence.slices] == [(0, 4, staged.prompt_sha256)]


def test_last_outputs_name_each_agents_last_selected_action():
    """What an external harness that closes without outputs is scored on: per agent, the last selected
    action call (a discarded retry, an auxiliary call and a failed call are not answers)."""
    ep = chain()
    ep.spawn("w", "worker-1", by="c2")
    ep.call("w1", "w", tokens([5], [6], [-1]))
    ep.call("w2", "w", tokens([5, 6, 7], [8], [-1]), extends="w1")
    ep.call("w3", "w", tokens([5, 6, 7, 8, 9], [1], [-1]), extends="w2")
    ep.ledger.discard("w3", "the harness sent the same request again")
    ep.call("c3", "a", tokens([1, 2, 3, 4, 5, 6, 7], [8], [-1]), extends="c2", kind=CallKind.AUXILIARY)
    ep.admit("c4", "a", "c3")
    ep.ledger.fail("c4", "engine error")
    ep.spawn("w.1", "worker-1", by="c2")  # invoked again: its newest context's answer is the last
    ep.call("v1", "w.1", tokens([4], [2], [-1]))
    ep.close()
    assert ep.ledger.last_outputs() == {"parent": "c2", "worker-1": "v1"}
