"""Row validation, the unique-token denominator, micro-batch planning and accumulation == one batch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bench.forests import random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from trainer.batch import (
    BehaviorLogprobError,
    DuplicateRowError,
    LossMaskMismatchError,
    OwnershipError,
    RowShapeError,
    plan_micro_batches,
    unique_eligible_tokens,
    validate_rows,
)
from trainer.learner import accumulate_gradients, load_policy, prepare_batch
from trainer.rows import Row, Span


def make_row(row_id, episode, length, spans, *, valid=True) -> Row:
    """spans: (call_id, start, end, owned, eligible); mask and logprobs follow from them."""
    mask = np.zeros(length, bool)
    for _, s, e, owned, eligible in spans:
        if owned and eligible:
            mask[s:e] = True
    blp = np.where(mask, -0.5, 0.0).astype(np.float32)
    return Row(
        row_id, episode, "g", np.arange(length, dtype=np.int32) + 3, mask, blp,
        tuple(Span(c, "parent", s, e, o, el, 0, 1.0, 1.0) for c, s, e, o, el in spans), 1.0, valid,
    )  # fmt: skip


# Episode A: call a0 [4,7) is shared by two rows (owned by the first); a1 [9,12) and a2 [9,11) end
# the rows. Episode B: one row, an auxiliary call x [3,5) (not eligible) and b0 [6,10).
ROW_A1 = make_row("A#a1", "A", 12, [("a0", 4, 7, True, True), ("a1", 9, 12, True, True)])
ROW_A2 = make_row("A#a2", "A", 11, [("a0", 4, 7, False, True), ("a2", 9, 11, True, True)])
ROW_B = make_row("B#b0", "B", 10, [("x", 3, 5, False, False), ("b0", 6, 10, True, True)])


def test_denominator_counts_each_eligible_call_once():
    # a0 3 + a1 3 + a2 2 + b0 4 = 12 (a0 appears in two rows, x is not eligible)
    assert unique_eligible_tokens([ROW_A1, ROW_A2, ROW_B]) == 12
    validate_rows([ROW_A1, ROW_A2, ROW_B])


def test_invalid_episode_counts_nowhere():
    bad_b = dataclasses.replace(ROW_B, valid=False)
    assert unique_eligible_tokens([ROW_A1, ROW_A2, bad_b]) == 8
    plan = plan_micro_batches([ROW_A1, ROW_A2, bad_b], {"A": 1.0, "B": 1.0}, 1000)
    assert sorted(i for mb in plan for i in mb.row_ids) == ["A#a1", "A#a2"]


def test_double_owner_and_missing_owner_are_refused():
    double = make_row("A#a2", "A", 11, [("a0", 4, 7, True, True), ("a2", 9, 11, True, True)])
    with pytest.raises(OwnershipError, match="'a0' is owned by 2 rows"):
        validate_rows([ROW_A1, double])
    orphan = make_row("A#a1", "A", 12, [("a0", 4, 7, False, True), ("a1", 9, 12, True, True)])
    with pytest.raises(OwnershipError, match="'a0' is owned by 0 rows"):
        validate_rows([orphan, ROW_A2])


def test_mask_must_equal_owned_eligible_spans():
    mask = ROW_A1.loss_mask.copy()
    mask[8] = True
    with pytest.raises(LossMaskMismatchError, match="position 8"):
        validate_rows([dataclasses.replace(ROW_A1, loss_mask=mask), ROW_A2])


def test_span_shapes_and_lengths_are_checked():
    at_zero = make_row("B#b0", "B", 10, [("b0", 0, 4, True, True)])
    with pytest.raises(RowShapeError, match="1 <= start"):
        validate_rows([at_zero])
    short = dataclasses.replace(ROW_B, loss_mask=ROW_B.loss_mask[:-1])
    with pytest.raises(RowShapeError, match="equally long"):
        validate_rows([short])
    other_len = make_row("A#a2", "A", 11, [("a0", 4, 6, False, True), ("a2", 9, 11, True, True)])
    with pytest.raises(OwnershipError, match="spans 3 tokens"):
        validate_rows([ROW_A1, other_len])


def test_behaviour_logprobs_must_be_zero_off_mask_and_finite_on_it():
    blp = ROW_B.behavior_logprobs.copy()
    blp[0] = -1.0
    with pytest.raises(BehaviorLogprobError, match="exactly 0 elsewhere"):
        validate_rows([dataclasses.replace(ROW_B, behavior_logprobs=blp)])
    blp = ROW_B.behavior_logprobs.copy()
    blp[7] = np.nan
    with pytest.raises(BehaviorLogprobError):
        validate_rows([dataclasses.replace(ROW_B, behavior_logprobs=blp)])


def test_duplicate_row_id_is_refused():
    with pytest.raises(DuplicateRowError, match="A#a1"):
        validate_rows([ROW_A1, ROW_A1])


def test_plan_pads_after_combining_and_respects_the_budget():
    plan = plan_micro_batches([ROW_B, ROW_A2, ROW_A1], {"A": 0.5, "B": -1.0}, budget=24)
    # lengths 12, 11, 10 sorted descending: [12, 11] -> 2 x 12 = 24 fits; 10 alone
    assert [mb.row_ids for mb in plan] == [("A#a1", "A#a2"), ("B#b0",)]
    assert [tuple(mb.input_ids.shape) for mb in plan] == [(2, 12), (1, 10)]
    assert plan[0].input_ids[1, 11].item() == 0  # right padding
    assert plan[0].real_tokens == 23 and plan[0].padded_tokens == 24
    # loss tokens row-major: row 0 positions 4,5,6,9,10,11; row 1 positions 9,10
    assert plan[0].loss_positions.tolist() == [4, 5, 6, 9, 10, 11, 9, 10]
    assert plan[0].loss_rows.tolist() == [0] * 6 + [1] * 2
    assert plan[1].advantages.tolist() == [-1.0] * 4
    again = plan_micro_batches([ROW_A1, ROW_B, ROW_A2], {"A": 0.5, "B": -1.0}, budget=24)
    assert [mb.row_ids for mb in again] == [mb.row_ids for mb in plan]


def test_a_row_longer_than_the_budget_goes_alone():
    plan = plan_micro_batches([ROW_A1, ROW_B], {"A": 1.0, "B": 1.0}, budget=5)
    assert [mb.row_ids for mb in plan] == [("A#a1",), ("B#b0",)]


def test_gradient_accumulation_equals_one_big_batch(small_model_dir):
    model = load_policy(small_model_dir, torch.device("cpu"), trainable=True)
    episodes = random_batch(11, vocab=model.config.vocab_size, groups=2, group_size=3, size=4)
    rows = [r for ep in episodes for r in rows_from_calls(ep)]

    def grads(budget):
        cfg = LearnerConfig(micro_batch_tokens=budget)
        batch = prepare_batch(rows, cfg)
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, batch.plan, batch.denominator, cfg, torch.device("cpu")).loss
        return len(batch.plan), loss, {k: p.grad.clone() for k, p in model.named_parameters()}

    n_one, loss_one, g_one = grads(10**6)
    n_many, loss_many, g_many = grads(1)
    trained = [r for r in rows if r.loss_mask.any()]  # auxiliary-only rows are not forwarded
    assert n_one == 1 and n_many == len(trained) > 4
    assert abs(loss_many - loss_one) <= 1e-6 * abs(loss_one)
    for name, g in g_one.items():
        assert float((g_many[name] - g).norm()) <= 1e-6 * float(g.norm()), name
