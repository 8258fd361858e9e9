"""An empty reply the harness left out of its history (OpenCode drops EOS-only assistant messages): the
gateway discards it and the next call extends what it extended (gateway/pipeline/continuation.py SKIP_EMPTY).
In the ledger and the reconstruction that is: the empty call is accounted as discarded, never trained,
and the next call's row continues the empty call's parent."""

from __future__ import annotations

from grove.receipts import CallState
from tests.forest.kit import Episode, assert_row, tokens

EOS = 9


def test_an_empty_reply_left_out_is_discarded_and_the_next_call_extends_its_parent():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c0", "a", tokens([1, 2], [3, EOS], [-0.5, -0.25]))
    ep.call("c1", "a", tokens([1, 2, 3, EOS, 4], [EOS], [-0.125]), extends="c0")  # empty: EOS only
    # The next request has no c1 turn: c1 is discarded, c2 extends c0 with c1's message + a new one.
    ep.ledger.discard("c1", "empty response left out of the harness's next request")
    ep.call("c2", "a", tokens([1, 2, 3, EOS, 4, 5], [6, EOS], [-1.0, -2.0]), extends="c0")
    accounting = ep.close()
    assert accounting.by_state[CallState.DISCARDED] == ["c1"]
    assert sorted(accounting.by_state[CallState.SELECTED]) == ["c0", "c2"]
    [row] = ep.reconstruct(reward=1.0).rows
    assert_row(
        row, row_id=row.row_id, input_ids=[1, 2, 3, EOS, 4, 5, 6, EOS], mask=[0, 0, 1, 1, 0, 0, 1, 1],
        logprobs=[0, 0, -0.5, -0.25, 0, 0, -1.0, -2.0],
        spans=[("c0", 2, 4, True, True), ("c2", 6, 8, True, True)],
    )  # fmt: skip


def test_an_empty_root_left_out_makes_the_next_call_the_contexts_root():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c0", "a", tokens([1, 2], [EOS], [-0.5]))  # the first reply was empty
    ep.ledger.discard("c0", "empty response left out of the harness's next request")
    ep.call("c1", "a", tokens([1, 2, 4], [5, EOS], [-1.0, -1.5]))  # a root again, in the same context
    accounting = ep.close()
    assert accounting.by_state[CallState.DISCARDED] == ["c0"]
    [row] = ep.reconstruct().rows
    assert row.input_ids.tolist() == [1, 2, 4, 5, EOS]
    assert [s.call_id for s in row.spans] == ["c1"]
