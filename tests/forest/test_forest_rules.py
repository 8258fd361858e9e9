"""Reconstruction rules on small hand-written episodes: every expected row is written out by hand."""

from __future__ import annotations

from grove.receipts import CallKind, CallState
from tests.forest.kit import Episode, assert_row, tokens
from trainer.forest import ReconstructionOptions


def test_single_agent_without_compaction_gives_one_row():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("c2", "a", tokens([1, 2, 3, 4, 5], [6], [-3]), extends="c1")
    ep.call("c3", "a", tokens([1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [-4, -5]), extends="c2")
    ep.close()
    (row,) = ep.reconstruct().rows
    assert_row(
        row,
        row_id="ep#c3",
        input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        mask=[0, 0, 1, 1, 0, 1, 0, 0, 1, 1],
        logprobs=[0, 0, -1, -2, 0, -3, 0, 0, -4, -5],
        spans=[("c1", 2, 4, True, True), ("c2", 5, 6, True, True), ("c3", 8, 10, True, True)],
    )


def test_single_agent_with_one_compaction_gives_two_rows():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("c2", "a", tokens([1, 2, 3, 4, 5], [6, 7], [-3, -4]), extends="c1")  # writes the summary
    ep.rewrite("a2", "parent", of="a")
    ep.call("c3", "a2", tokens([8, 6, 7], [9], [-5]))  # the summary comes back as input
    ep.call("c4", "a2", tokens([8, 6, 7, 9, 11], [12, 13], [-6, -7]), extends="c3")
    ep.close()
    first, second = ep.reconstruct().rows
    assert_row(
        first,
        row_id="ep#c2",
        input_ids=[1, 2, 3, 4, 5, 6, 7],
        mask=[0, 0, 1, 1, 0, 1, 1],
        logprobs=[0, 0, -1, -2, 0, -3, -4],
        spans=[("c1", 2, 4, True, True), ("c2", 5, 7, True, True)],
    )
    assert_row(
        second,
        row_id="ep#c4",
        input_ids=[8, 6, 7, 9, 11, 12, 13],
        mask=[0, 0, 0, 1, 0, 1, 1],
        logprobs=[0, 0, 0, -5, 0, -6, -7],
        spans=[("c3", 3, 4, True, True), ("c4", 5, 7, True, True)],
    )


def test_shared_prefix_branch_trains_the_ancestor_in_the_first_canonical_row_only():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("c2", "a", tokens([1, 2, 3, 4, 5], [6, 7], [-3, -4]), extends="c1")
    ep.call("b2", "a", tokens([1, 2, 3, 4, 8], [9], [-5]), extends="c1", branch=True)
    ep.close()
    b2, c2 = ep.reconstruct().rows  # canonical: same context and depth, so by call id: b2 < c2
    assert_row(
        b2,
        row_id="ep#b2",
        input_ids=[1, 2, 3, 4, 8, 9],
        mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0, 0, -1, -2, 0, -5],
        spans=[("c1", 2, 4, True, True), ("b2", 5, 6, True, True)],
    )
    assert_row(
        c2,
        row_id="ep#c2",
        input_ids=[1, 2, 3, 4, 5, 6, 7],
        mask=[0, 0, 0, 0, 0, 1, 1],
        logprobs=[0, 0, 0, 0, 0, -3, -4],
        spans=[("c1", 2, 4, False, True), ("c2", 5, 7, True, True)],
    )


def test_discarded_retry_is_accounted_and_never_trained_nor_needed():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3], [-1]))
    ep.call("c2", "a", tokens([1, 2, 3, 4], [5, 5, 5], [-9, -9, -9]), extends="c1")
    ep.ledger.discard("c2", "harness retried: malformed tool call")
    ep.call("c2r", "a", tokens([1, 2, 3, 4], [6], [-2]), extends="c1")
    acc = ep.close()
    assert acc.by_state[CallState.DISCARDED] == ["c2"]
    assert ep.ledger.calls["c2"].note == "harness retried: malformed tool call"
    del ep.staged["c2"]  # a discarded call's arrays are not needed
    result = ep.reconstruct()
    (row,) = result.rows
    assert_row(
        row,
        row_id="ep#c2r",
        input_ids=[1, 2, 3, 4, 6],
        mask=[0, 0, 1, 0, 1],
        logprobs=[0, 0, -1, 0, -2],
        spans=[("c1", 2, 3, True, True), ("c2r", 4, 5, True, True)],
    )
    assert result.accounting.by_state[CallState.DISCARDED] == ["c2"]
    assert result.accounting.eligible_calls == ["c1", "c2r"]


def _with_auxiliary_calls() -> Episode:
    """A parent call, a title call and a summary call in auxiliary contexts of their own."""
    ep = Episode()
    ep.root("p", "parent")
    ep.root("t", "parent~title")
    ep.root("s", "parent~summary")
    ep.call("p1", "p", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("t1", "t", tokens([90, 91], [92], [-9]), kind=CallKind.TITLE)
    ep.call("s1", "s", tokens([80, 81], [82, 83], [-8, -7]), kind=CallKind.SUMMARY)
    ep.close()
    return ep


def test_auxiliary_calls_are_not_trained_by_default():
    ep = _with_auxiliary_calls()
    assert ep.ledger.calls["t1"].state == CallState.AUXILIARY
    assert ep.ledger.calls["s1"].state == CallState.AUXILIARY
    result = ep.reconstruct()
    assert [r.row_id for r in result.rows] == ["ep#p1"]
    assert result.accounting.by_state[CallState.AUXILIARY] == ["s1", "t1"]
    assert result.accounting.endpoints_without_loss == ["s1", "t1"]
    assert result.accounting.eligible_calls == ["p1"]
    assert result.accounting.summary_calls == ["s1"] and result.accounting.summary_calls_trained == []


def test_summary_call_is_trained_when_configured_and_the_title_never():
    result = _with_auxiliary_calls().reconstruct(ReconstructionOptions(train_auxiliary=["summary"]))
    assert [r.row_id for r in result.rows] == ["ep#p1", "ep#s1"]
    assert_row(
        result.rows[1],
        row_id="ep#s1",
        input_ids=[80, 81, 82, 83],
        mask=[0, 0, 1, 1],
        logprobs=[0, 0, -8, -7],
        spans=[("s1", 2, 4, True, True)],
    )
    assert result.accounting.eligible_calls == ["p1", "s1"]
    assert result.accounting.summary_calls_trained == ["s1"] and result.accounting.summary_tokens_trained == 2


def test_a_parent_only_run_trains_the_parents_summary_but_no_workers():
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", tokens([1, 2], [3], [-1]))
    ep.root("ps", "parent~summary")
    ep.call("ps1", "ps", tokens([5, 6], [7], [-2]), kind=CallKind.SUMMARY)
    ep.spawn("w", "worker-1", by="p1")
    ep.call("w1", "w", tokens([4], [8, 9], [-3, -4]), kind=CallKind.SUMMARY)
    ep.close()
    options = ReconstructionOptions(train_agents="parent_only", train_auxiliary=["summary"])
    result = ep.reconstruct(options)
    assert result.accounting.eligible_calls == ["p1", "ps1"]
    assert result.accounting.summary_calls == ["ps1", "w1"] and result.accounting.summary_tokens_trained == 1


def test_auxiliary_leaf_in_a_context_still_carries_its_ancestors_loss():
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("a1", "p", tokens([1, 2, 3, 4, 70], [71], [-7]), extends="p1", kind=CallKind.AUXILIARY)
    ep.call("p2", "p", tokens([1, 2, 3, 4, 5], [6], [-3]), extends="p1", branch=True)
    ep.close()
    a1, p2 = ep.reconstruct().rows  # a1 < p2 at the same depth: a1's row owns p1
    assert_row(
        a1,
        row_id="ep#a1",
        input_ids=[1, 2, 3, 4, 70, 71],
        mask=[0, 0, 1, 1, 0, 0],
        logprobs=[0, 0, -1, -2, 0, 0],
        spans=[("p1", 2, 4, True, True), ("a1", 5, 6, False, False)],
    )
    assert_row(
        p2,
        row_id="ep#p2",
        input_ids=[1, 2, 3, 4, 5, 6],
        mask=[0, 0, 0, 0, 0, 1],
        logprobs=[0, 0, 0, 0, 0, -3],
        spans=[("p1", 2, 4, False, True), ("p2", 5, 6, True, True)],
    )


def test_cancelled_and_failed_worker_calls_are_accounted_and_not_trained():
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", tokens([1, 2], [3], [-1]))
    ep.spawn("w", "worker-1", by="p1")
    ep.admit("w1", "w")
    ep.ledger.fail("w1", "vLLM engine died")
    ep.admit("w2", "w")  # the failed call left the line: w2 is the context's new root
    ep.spawn("v", "worker-2", by="p1")
    ep.admit("v1", "v")
    ep.ledger.cancel("v1", "parent no longer needs worker-2")
    ep.call("p2", "p", tokens([1, 2, 3, 4], [5], [-2]), extends="p1")
    acc = ep.close(cancel_outstanding=True)
    assert acc.by_state[CallState.FAILED] == ["w1"]
    assert acc.by_state[CallState.CANCELLED] == ["v1", "w2"]
    assert acc.cancelled_at_close == ["w2"]
    assert ep.ledger.calls["w2"].note == "cancelled at close: episode closed"
    result = ep.reconstruct()
    assert [r.row_id for r in result.rows] == ["ep#p2"]
    assert result.accounting.by_state[CallState.CANCELLED] == ["v1", "w2"]
    assert result.accounting.per_agent["worker-1"].states[CallState.FAILED] == 1
    assert result.accounting.per_agent["worker-1"].rows == 0


def test_rows_do_not_depend_on_the_order_receipts_are_given_in():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("c2", "a", tokens([1, 2, 3, 4, 5], [6, 7], [-3, -4]), extends="c1")
    ep.call("b2", "a", tokens([1, 2, 3, 4, 8], [9], [-5]), extends="c1", branch=True)
    ep.close()
    from trainer.forest import EpisodeRef, reconstruct
    from trainer.rows import rows_to_parquet

    ref = EpisodeRef(episode_id="ep", group_id="grp")
    forward = reconstruct(ref, ep.ledger.receipts(), ep.staged)
    backward = reconstruct(ref, list(reversed(ep.ledger.receipts())), dict(reversed(list(ep.staged.items()))))
    assert rows_to_parquet(forward.rows) == rows_to_parquet(backward.rows)
    assert forward.accounting == backward.accounting
