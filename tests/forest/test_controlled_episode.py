"""The controlled episode of the acceptance criteria, with every row written out by hand.

Story (token ids are arbitrary small numbers; 41/42/43 frame the tool results in the parent):

    parent  p1   prompt [1 2 3]                       -> [10 11 12]   spawns worker-1 and worker-2
    worker-1 w1a prompt [20 21]                       -> [22 23 24]
    worker-2 w2a prompt [30 31]                       -> [32 33]      (overlaps w1a in time)
    worker-2 w2b prompt w2a + [34]                    -> [35 36]      asks for a summary (compaction)
    worker-2 w2c prompt [38 35 36]  (rewrite: summary fed back)  -> [39 40]   worker-2's answer
    worker-1 w1b prompt w1a + [25]                    -> [26 27]      worker-1's answer (after worker-2's)
    parent  p2   prompt p1 + [41 26 27 42 39 40 43]   -> [51 52]      resumes after both answered

Workers complete in the reverse of their spawn order; worker-2 compacts mid-way.
"""

from __future__ import annotations

from grove.receipts import CallState
from tests.forest.kit import Episode, assert_row, tokens
from trainer.forest import ReconstructionOptions
from trainer.rows import rows_from_parquet, rows_to_parquet

P1 = tokens([1, 2, 3], [10, 11, 12], [-0.1, -0.2, -0.3])
W1A = tokens([20, 21], [22, 23, 24], [-1.1, -1.2, -1.3])
W2A = tokens([30, 31], [32, 33], [-2.1, -2.2])
W2B = tokens([30, 31, 32, 33, 34], [35, 36], [-2.3, -2.4])
W2C = tokens([38, 35, 36], [39, 40], [-2.5, -2.6])
W1B = tokens([20, 21, 22, 23, 24, 25], [26, 27], [-1.4, -1.5])
P2 = tokens([1, 2, 3, 10, 11, 12, 41, 26, 27, 42, 39, 40, 43], [51, 52], [-0.4, -0.5])


def run_controlled_episode(worker_2_first: bool = True) -> Episode:
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", P1, version=3)
    ep.spawn("w1", "worker-1", by="p1")
    ep.spawn("w2", "worker-2", by="p1")
    ep.admit("w1a", "w1")
    ep.admit("w2a", "w2")  # both workers' first calls are outstanding at once

    def worker_2() -> None:
        ep.complete("w2a", W2A, 3)
        ep.call("w2b", "w2", W2B, extends="w2a", version=3)
        ep.rewrite("w2r", "worker-2", of="w2")
        ep.call("w2c", "w2r", W2C, version=4)

    def worker_1() -> None:
        ep.complete("w1a", W1A, 3)
        ep.call("w1b", "w1", W1B, extends="w1a", version=4)

    for step in (worker_2, worker_1) if worker_2_first else (worker_1, worker_2):
        step()
    ep.call("p2", "p", P2, extends="p1", version=4)
    return ep


def test_controlled_episode_rows_are_exactly_the_hand_written_ones():
    ep = run_controlled_episode()
    ep.close()
    rows = ep.reconstruct(reward=1.0).rows

    assert [r.row_id for r in rows] == ["ep#p2", "ep#w1b", "ep#w2b", "ep#w2c"]
    p2, w1b, w2b, w2c = rows
    assert_row(
        p2,
        row_id="ep#p2",
        input_ids=[1, 2, 3, 10, 11, 12, 41, 26, 27, 42, 39, 40, 43, 51, 52],
        mask=[0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        logprobs=[0, 0, 0, -0.1, -0.2, -0.3, 0, 0, 0, 0, 0, 0, 0, -0.4, -0.5],
        spans=[("p1", 3, 6, True, True), ("p2", 13, 15, True, True)],
    )
    assert_row(
        w1b,
        row_id="ep#w1b",
        input_ids=[20, 21, 22, 23, 24, 25, 26, 27],
        mask=[0, 0, 1, 1, 1, 0, 1, 1],
        logprobs=[0, 0, -1.1, -1.2, -1.3, 0, -1.4, -1.5],
        spans=[("w1a", 2, 5, True, True), ("w1b", 6, 8, True, True)],
    )
    assert_row(
        w2b,
        row_id="ep#w2b",
        input_ids=[30, 31, 32, 33, 34, 35, 36],
        mask=[0, 0, 1, 1, 0, 1, 1],
        logprobs=[0, 0, -2.1, -2.2, 0, -2.3, -2.4],
        spans=[("w2a", 2, 4, True, True), ("w2b", 5, 7, True, True)],
    )
    # The summary [35 36] is an observation here: it was trained once, in w2b's row.
    assert_row(
        w2c,
        row_id="ep#w2c",
        input_ids=[38, 35, 36, 39, 40],
        mask=[0, 0, 0, 1, 1],
        logprobs=[0, 0, 0, -2.5, -2.6],
        spans=[("w2c", 3, 5, True, True)],
    )
    assert [r.episode_id for r in rows] == ["ep"] * 4 and [r.group_id for r in rows] == ["grp"] * 4
    assert [r.reward for r in rows] == [1.0] * 4 and all(r.valid for r in rows)
    assert [[s.policy_version for s in r.spans] for r in rows] == [[3, 4], [3, 4], [3, 3], [4]]
    assert [[s.agent for s in r.spans] for r in rows] == [
        ["parent", "parent"],
        ["worker-1", "worker-1"],
        ["worker-2", "worker-2"],
        ["worker-2"],
    ]


def test_controlled_episode_accounting_is_complete():
    ep = run_controlled_episode()
    ledger_acc = ep.close()
    assert ledger_acc.by_state[CallState.SELECTED] == ["p1", "p2", "w1a", "w1b", "w2a", "w2b", "w2c"]
    assert ledger_acc.admitted == ["p1", "p2", "w1a", "w1b", "w2a", "w2b", "w2c"]
    for state in (CallState.DISCARDED, CallState.AUXILIARY, CallState.CANCELLED, CallState.FAILED):
        assert ledger_acc.by_state[state] == []

    acc = ep.reconstruct().accounting
    assert acc.members == 7 and acc.verified_links == 3  # p2->p1, w1b->w1a, w2b->w2a
    assert acc.endpoints == ["p2", "w1b", "w2b", "w2c"] and acc.endpoints_without_loss == []
    assert acc.rows == 4
    assert acc.eligible_calls == ["p1", "p2", "w1a", "w1b", "w2a", "w2b", "w2c"]
    assert acc.eligible_tokens == 3 + 2 + 3 + 2 + 2 + 2 + 2
    assert {a: (x.eligible_calls, x.eligible_tokens, x.rows) for a, x in acc.per_agent.items()} == {
        "parent": (2, 5, 1),
        "worker-1": (2, 5, 1),
        "worker-2": (3, 6, 2),
    }


def test_controlled_episode_gives_each_action_loss_exactly_once():
    ep = run_controlled_episode()
    ep.close()
    rows = ep.reconstruct().rows
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    assert sorted(owned) == ["p1", "p2", "w1a", "w1b", "w2a", "w2b", "w2c"]
    assert sum(r.num_loss_tokens for r in rows) == 16  # 3+2 parent, 3+2 worker-1, 2+2+2 worker-2


def test_controlled_episode_is_byte_identical_whichever_worker_finishes_first():
    first = run_controlled_episode(worker_2_first=True)
    second = run_controlled_episode(worker_2_first=False)
    first.close(), second.close()
    a = rows_to_parquet(first.reconstruct().rows)
    b = rows_to_parquet(second.reconstruct().rows)
    assert a == b
    assert [r.row_id for r in rows_from_parquet(a)] == ["ep#p2", "ep#w1b", "ep#w2b", "ep#w2c"]


def test_controlled_episode_parent_only_baseline_trains_the_parent_alone():
    ep = run_controlled_episode()
    ep.close()
    result = ep.reconstruct(ReconstructionOptions(train_agents="parent_only"))
    assert [r.row_id for r in result.rows] == ["ep#p2"]
    assert_row(
        result.rows[0],
        row_id="ep#p2",
        input_ids=[1, 2, 3, 10, 11, 12, 41, 26, 27, 42, 39, 40, 43, 51, 52],
        mask=[0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        logprobs=[0, 0, 0, -0.1, -0.2, -0.3, 0, 0, 0, 0, 0, 0, 0, -0.4, -0.5],
        spans=[("p1", 3, 6, True, True), ("p2", 13, 15, True, True)],
    )
    assert result.accounting.eligible_calls == ["p1", "p2"] and result.accounting.eligible_tokens == 5
    assert result.accounting.endpoints_without_loss == ["w1b", "w2b", "w2c"]


def test_controlled_episode_summary_while_workers_overlap():
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", P1)
    ep.spawn("w1", "worker-1", by="p1")
    ep.spawn("w2", "worker-2", by="p1")
    ep.admit("w1a", "w1")
    ep.admit("w2a", "w2")
    summary = ep.ledger.summary()
    assert summary.totals[CallState.ADMITTED] == 2 and summary.totals[CallState.COMPLETED] == 1
    assert {c.context_id: c.pending for c in summary.contexts} == {"p": [], "w1": ["w1a"], "w2": ["w2a"]}
    assert {c.context_id: c.head for c in summary.contexts} == {"p": "p1", "w1": "w1a", "w2": "w2a"}
