"""Packed and tree layouts (trainer/packing.py, trainer/attention.py): structure, attention, exactness.

Expected values come from the rows themselves, never from the layout code: distinct prefixes are
counted by hashing every row prefix, ancestors by walking parent pointers, attention is compared with
SDPA under a dense mask built from those walks, and loss/gradients with the padded learner and the
independent per-call reference of test_reference.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from bench.forests import (
    Call,
    Episode,
    delegation_batch,
    long_prefix_episode,
    random_batch,
    rows_from_calls,
    with_mixed_sampling,
)
from grove.learner_config import LearnerConfig
from tests.learner.test_batch import ROW_A1, ROW_B, make_row
from tests.learner.test_reference import (
    MIXED,
    REL_TOL,
    controlled_batch,
    learner_loss,
    per_call_reference,
    ref_logprobs,
    rows_of,
    separated_sampling,
    worst_relative,
)
from trainer import attention
from trainer.attention import Segment, plan_segments, segment_attention
from trainer.learner import Learner, load_policy, prepare_batch, score_tokens
from trainer.packing import layout, plan_layouts, plan_packed_micro_batches

CPU = torch.device("cpu")


def distinct_prefixes(rows) -> int:
    """Independent count: (episode, bytes of tokens[: i + 1]) over every position of every row."""
    seen = set()
    for r in rows:
        ids = r.input_ids.astype(np.int64)
        for i in range(len(ids)):
            seen.add((r.episode_id, ids[: i + 1].tobytes()))
    return len(seen)


def path_of(flat, q: int) -> list[int]:
    """Flat indices from the root down to q, by parent pointers."""
    out = []
    while q >= 0:
        out.append(q)
        q = int(flat.parent[q])
    return out[::-1]


def shared_prefix_rows():
    """Episode A: rows sharing a 9-token prefix (a0 owned by the first), plus B unrelated."""
    a1 = ROW_A1
    a2 = make_row("A#a2", "A", 11, [("a0", 4, 7, False, True), ("a2", 9, 11, True, True)])
    ids = a2.input_ids.copy()
    ids[9:] = [900, 901]  # diverge after position 8
    return [a1, type(a2)(**{**a2.__dict__, "input_ids": ids}), ROW_B]


# ---- structure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["packed", "tree"])
def test_every_loss_token_sits_at_a_node_whose_path_is_its_row_prefix(kind):
    rows = shared_prefix_rows()
    flat = layout(rows, kind)
    for r, p, tok, pred in zip(flat.loss_row, flat.loss_pos, flat.loss_token, flat.loss_pred, strict=True):
        row = rows[r]
        path = path_of(flat, int(tok))
        assert flat.input_ids[path].tolist() == row.input_ids[: p + 1].tolist()
        assert flat.position_ids[tok] == p and pred == path[-2]
    # loss entries: every row's mask positions, row-major
    expected = [(i, p) for i, r in enumerate(rows) for p in np.flatnonzero(r.loss_mask)]
    assert list(zip(flat.loss_row.tolist(), flat.loss_pos.tolist(), strict=True)) == expected


def test_tree_forwards_each_distinct_prefix_once_and_packing_every_row_token():
    rows = shared_prefix_rows()
    assert layout(rows, "tree").input_ids.size == distinct_prefixes(rows) == 12 + 2 + 10
    assert layout(rows, "packed").input_ids.size == 12 + 11 + 10


@pytest.mark.parametrize("kind", ["packed", "tree"])
def test_ancestor_rule_and_segments_match_parent_walks(kind):
    rows = rows_of(controlled_batch(512))
    flat = layout(rows, kind)
    n = flat.input_ids.size
    for q in range(n):
        by_rule = [k for k in range(q + 1) if q < flat.subtree_end[k]]
        assert by_rule == path_of(flat, q), q
    for seg in flat.segments:  # a segment's keys are exactly each query's ancestors
        keys = [k for s, e in seg.context for k in range(s, e)]
        for q in range(seg.start, seg.end):
            assert keys + list(range(seg.start, q + 1)) == path_of(flat, q)


def test_rows_sharing_nothing_make_the_tree_identical_to_packing():
    rows = [ROW_A1, ROW_B]  # different episodes: nothing to share
    tree, packed = layout(rows, "tree"), layout(rows, "packed")
    assert tree.input_ids.tolist() == packed.input_ids.tolist()
    assert tree.segments == packed.segments


def test_budgets_bound_forwarded_tokens_and_plans_ignore_input_order():
    rows = rows_of(random_batch(3, vocab=512, groups=2, group_size=3, size=4))
    for kind in ("packed", "tree"):
        plan = plan_layouts(rows, kind, 200)
        assert len(plan) > 1
        assert all(f.input_ids.size <= 200 or len(b) == 1 for b, f in plan)
        again = plan_layouts(rows[::-1], kind, 200)
        assert [[r.row_id for r in b] for b, _ in again] == [[r.row_id for r in b] for b, _ in plan]
        trained = sorted(r.row_id for r in rows if r.loss_mask.any())
        assert sorted(r.row_id for b, _ in plan for r in b) == trained


def test_tree_forwards_exactly_the_unique_tokens_of_delegation_and_long_prefix_episodes(learner_model_dir):
    tok = AutoTokenizer.from_pretrained(learner_model_dir)
    delegation = [r for ep in delegation_batch(tok) for r in rows_from_calls(ep)]
    small = long_prefix_episode(
        np.random.default_rng(0), "L", "g", 1.0, vocab=512, parent_tokens=256, worker_tokens=128
    )
    for rows in (delegation, rows_from_calls(small)):
        plan = plan_layouts(rows, "tree", 10**6)
        forwarded = sum(f.input_ids.size for _, f in plan)
        assert forwarded == distinct_prefixes(rows) < sum(len(r.input_ids) for r in rows)


# ---- attention ---------------------------------------------------------------------------------------


def test_segment_attention_equals_sdpa_under_the_dense_ancestor_mask():
    rows = rows_of(controlled_batch(512))
    flat = layout(rows, "tree")
    n = flat.input_ids.size
    dense = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        dense[q, path_of(flat, q)] = True
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True).transpose(1, 2)
    got, _ = segment_attention(None, q, k, v, None, segment_plan=plan_segments(flat.segments, n))
    assert torch.allclose(got, want, atol=1e-12)


def _dense_from_segments(segments, n: int) -> torch.Tensor:
    """bool [n, n]: each query sees its segment's context ranges and its own segment causally."""
    dense = torch.zeros(n, n, dtype=torch.bool)
    for seg in segments:
        for q in range(seg.start, seg.end):
            for s, e in seg.context:
                dense[q, s:e] = True
            dense[q, seg.start : q + 1] = True
    return dense


def _uneven_contexts():
    """Two context segments of unequal context length in one bucket (a padded, masked context)."""
    segments = [Segment(0, 100, ()), Segment(100, 180, ((0, 100),)), Segment(180, 250, ((0, 70),))]
    plan = plan_segments(segments, 250)
    assert any(b.ctx_mask is not None for b in plan.buckets)  # the case this exercises
    return segments, 250


def _tree_segments(rows):
    flat = layout(rows, "tree")
    return flat.segments, int(flat.input_ids.size)


@pytest.mark.parametrize("split_min", [0, 10**9], ids=["split", "masked"])
@pytest.mark.parametrize("case", ["controlled tree", "long-prefix tree", "uneven contexts"])
def test_segment_attention_output_and_gradients_equal_sdpa_under_the_dense_mask(case, split_min, monkeypatch):
    """The split context/causal attention (merged by logsumexp, its own backward), and the one masked
    call short segments take, against one SDPA call over the dense ancestor mask: output and
    gradients of q, k, v, float64."""
    monkeypatch.setattr(attention, "SPLIT_MIN_QUERIES", split_min)
    if case == "controlled tree":
        segments, n = _tree_segments(rows_of(controlled_batch(512)))
    elif case == "long-prefix tree":
        ep = long_prefix_episode(
            np.random.default_rng(0), "L", "g", 1.0, vocab=512, parent_tokens=256, worker_tokens=128
        )
        segments, n = _tree_segments(rows_from_calls(ep))
    else:
        segments, n = _uneven_contexts()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g, dtype=torch.float64).requires_grad_() for h in (4, 2, 2))
    grad_out = torch.randn(1, n, 4, 16, generator=g, dtype=torch.float64)
    dense = _dense_from_segments(segments, n)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True).transpose(1, 2)
    got, _ = segment_attention(None, q, k, v, None, segment_plan=plan_segments(segments, n))
    assert torch.allclose(got, want, atol=1e-12)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), grad_out),
        torch.autograd.grad(want, (q, k, v), grad_out),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=1e-12)


def test_tree_attention_computes_few_more_pairs_than_the_ancestor_pairs():
    """Pairs the buckets compute vs the real (query, ancestor-or-self) pairs, counted from the layout's
    depths (each token sees depth + 1 keys). A bucket mixing the context-free root prefix with the
    workers' context segments computed the root's square in full; one masked call per context bucket
    computed the upper triangle of each segment's own square; split into context and causal parts, only
    bucket padding remains, within the bound below (measured ratios: docs/results.md section 4)."""
    ep = long_prefix_episode(
        np.random.default_rng(0), "L", "g", 1.0, vocab=512, parent_tokens=1024, worker_tokens=512
    )
    flat = layout(rows_from_calls(ep), "tree")
    real = int((flat.position_ids.astype(np.int64) + 1).sum())
    plan = plan_segments(flat.segments, flat.input_ids.size)
    assert plan.computed_pairs <= 1.05 * real, (plan.computed_pairs, real)


def test_segment_plan_must_cover_the_sequence():
    with pytest.raises(ValueError, match="position 3"):
        plan_segments([Segment(0, 3, ())], 5)


# ---- exactness -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(small_model_dir):
    return load_policy(small_model_dir, CPU, trainable=True)


@pytest.mark.parametrize("kind", ["packed", "tree"])
@pytest.mark.parametrize(
    "seed, knobs",
    [
        (1, {}),
        (3, {"micro_batch_tokens": 150}),
        (5, {"micro_batch_tokens": 1}),
    ],
)
def test_packed_layouts_match_the_per_call_reference_and_the_padded_learner(policy, kind, seed, knobs):
    episodes = random_batch(seed, vocab=policy.config.vocab_size, groups=2, group_size=3, size=4)
    # each token under its own call's sampling, top_p off its boundaries (test_reference.py says why)
    episodes = separated_sampling(policy, with_mixed_sampling(episodes, MIXED, seed))
    rows = rows_of(episodes)
    cfg = LearnerConfig(layout=kind, **knobs)
    loss, grads = learner_loss(policy, rows, cfg)
    ref = per_call_reference(policy, episodes, cfg)
    assert worst_relative(loss, grads, *ref) <= REL_TOL
    padded = learner_loss(policy, rows, cfg.model_copy(update={"layout": "padded"}))
    assert worst_relative(loss, grads, *padded) <= REL_TOL


def test_tree_of_the_controlled_episode_matches_the_reference(policy):
    episodes = controlled_batch(policy.config.vocab_size)
    rows = rows_of(episodes)
    cfg = LearnerConfig(layout="tree")
    plan = prepare_batch(rows, cfg).plan
    assert sum(mb.real_tokens for mb in plan) == distinct_prefixes(rows) < sum(len(r.input_ids) for r in rows)
    loss, grads = learner_loss(policy, rows, cfg)
    assert worst_relative(loss, grads, *per_call_reference(policy, episodes, cfg)) <= REL_TOL


def same_prompt_batch(vocab: int) -> list[Episode]:
    """Two selected calls sampled from one prompt (n=2): their rows diverge at a completion's first
    token, so in the tree that token's parent is not the flat token before it."""
    rng = np.random.default_rng(3)
    episodes = []
    for j, reward in enumerate([1.0, 0.0]):

        def toks(n):
            return rng.integers(3, vocab, size=n).astype(np.int32)

        def lp(n):
            return -rng.uniform(0.1, 3.0, size=n).astype(np.float32)

        root = Call("parent/c0/000", "parent", "parent/c0", None, toks(7), toks(4), lp(4))
        prompt = np.concatenate([root.prompt, root.completion, toks(3)])
        a = Call("parent/c0/001", "parent", "parent/c0", root.call_id, prompt, toks(5), lp(5))
        b = Call("parent/c0/002", "parent", "parent/c0", root.call_id, prompt, toks(6), lp(6))
        episodes.append(Episode(f"n2-{j}", "group-n2", reward, [root, a, b]))
    return episodes


def test_tree_with_calls_sharing_a_prompt_matches_the_reference(policy):
    episodes = same_prompt_batch(policy.config.vocab_size)
    rows = rows_of(episodes)
    cfg = LearnerConfig(layout="tree")
    flat = layout(rows, "tree")
    assert any(pred != tok - 1 for pred, tok in zip(flat.loss_pred, flat.loss_token, strict=True))
    loss, grads = learner_loss(policy, rows, cfg)
    assert worst_relative(loss, grads, *per_call_reference(policy, episodes, cfg)) <= REL_TOL


def _with_positions(plan, positions):
    return [dataclasses.replace(mb, position_ids=positions(mb)) for mb in plan]


@pytest.mark.parametrize("bug", ["flat_positions", "score_at_previous_flat_token"])
def test_layout_bugs_break_the_agreement(policy, bug):
    episodes = controlled_batch(policy.config.vocab_size) + same_prompt_batch(policy.config.vocab_size)
    rows = rows_of(episodes)
    cfg = LearnerConfig(layout="tree")
    batch = prepare_batch(rows, cfg)
    if bug == "flat_positions":  # position ids = index in the flat sequence instead of depth
        plan = _with_positions(batch.plan, lambda mb: torch.arange(mb.input_ids.shape[1])[None])
    else:  # score token t with the logits of flat token t-1 (right for rows, wrong in a tree)
        plan = []
        for mb in batch.plan:
            keep = torch.unique(torch.cat([mb.logit_positions, mb.loss_positions - 1]))
            plan.append(
                dataclasses.replace(
                    mb,
                    logit_positions=keep,
                    loss_pred_positions=torch.searchsorted(keep, mb.loss_positions - 1),
                )
            )
    loss, grads = learner_loss(policy, rows, cfg, plan=plan)
    assert worst_relative(loss, grads, *per_call_reference(policy, episodes, cfg)) > 1e-3


def test_tree_ratios_are_one_on_policy(policy):
    """Behaviour logprobs = each call scored alone by the same weights (the sampler's view, computed
    by test_reference's independent recipe); the tree scores the same tokens: ratio 1."""
    episodes = controlled_batch(policy.config.vocab_size) + same_prompt_batch(policy.config.vocab_size)
    episodes = with_mixed_sampling(episodes, [(0.8, 1.0), (1.3, 1.0), (1.0, 1.0)], 0)
    cfg = LearnerConfig(layout="tree")
    on_policy = []
    with torch.no_grad():
        for ep in episodes:
            calls = []
            for c in ep.calls:
                seq = torch.from_numpy(np.concatenate([c.prompt, c.completion]).astype(np.int64))[None]
                logits = policy(seq).logits[0, c.prompt.size - 1 : -1]
                lp = ref_logprobs(
                    logits, torch.from_numpy(c.completion.astype(np.int64)), c.temperature, c.top_p
                )
                calls.append(dataclasses.replace(c, logprobs=lp.numpy().astype(np.float32)))
            on_policy.append(dataclasses.replace(ep, calls=calls))
    batch = prepare_batch(rows_of(on_policy), cfg)
    worst = 0.0
    with torch.no_grad():
        for mb in batch.plan:
            ratio = torch.exp(score_tokens(policy, mb, cfg, CPU) - mb.behavior_logprobs)
            worst = max(worst, float((ratio - 1).abs().max()))
    assert worst <= 2e-6  # float32 rounding of two differently shaped forwards


def test_learner_step_reports_forwarded_row_and_unique_tokens(small_model_dir):
    rows = rows_of(controlled_batch(512))
    unique, row_tokens = distinct_prefixes(rows), sum(len(r.input_ids) for r in rows if r.loss_mask.any())
    seen = {}
    for kind in ("padded", "packed", "tree"):
        m = Learner(small_model_dir, LearnerConfig(layout=kind, lr=1e-3), device="cpu").step(rows)
        assert (m.unique_tokens, m.row_tokens) == (unique, row_tokens)
        seen[kind] = m
    assert seen["padded"].forwarded_tokens == seen["packed"].forwarded_tokens == seen["packed"].padded_tokens
    assert seen["tree"].forwarded_tokens == seen["tree"].padded_tokens == unique < row_tokens
    assert seen["padded"].loss == pytest.approx(seen["tree"].loss, rel=1e-6)


def test_packed_plan_gathers_each_tokens_numbers_from_its_owning_row():
    rows = shared_prefix_rows()
    blp = rows[1].behavior_logprobs.copy()
    blp[rows[1].loss_mask] = [-0.25, -0.75]
    rows[1] = type(rows[1])(**{**rows[1].__dict__, "behavior_logprobs": blp})
    for kind in ("packed", "tree"):
        (mb,) = plan_packed_micro_batches(rows, {"A": 0.5, "B": -1.0}, kind, 10**6)
        want_blp = np.concatenate([r.behavior_logprobs[r.loss_mask] for r in rows])
        want_adv = np.concatenate(
            [np.full(r.num_loss_tokens, {"A": 0.5, "B": -1.0}[r.episode_id]) for r in rows]
        )
        assert mb.behavior_logprobs.tolist() == want_blp.tolist()
        assert mb.advantages.tolist() == want_adv.tolist()
        tokens = mb.input_ids[0, mb.loss_positions].tolist()
        assert tokens == np.concatenate([r.input_ids[r.loss_mask] for r in rows]).tolist()
