"""Packed and tree-packed micro-batches: rows -> one flat sequence per micro-batch, no padding.

Rows stay the exchange format; this is the learner's own layout, derived from them (docs/design.md,
"7. GRPO and the failure rule", Layouts).

- **packed**: rows end to end. Each row keeps its own position ids (0..T-1) and attends only to
  itself, causally.
- **tree**: the rows of each episode are merged into a token trie (rows share prefixes: a parent
  context in several rows, a fork point, a system prompt every context starts with). A trie node is
  one token *with its whole prefix*, so it has exactly one hidden state, and every distinct prefix of
  the episode is forwarded once. Each token attends to exactly its ancestors (its own prefix), and
  its position id is its depth = its position in every row that contains it. Rows that share
  nothing give chains, i.e. exactly the packed layout: the tree falls back to packing by itself.

Both lay the trie out in pre-order, so the ancestors of token q are the keys k <= q whose subtree
still contains q (`subtree_end[k] > q`), and the sequence cuts into segments (maximal runs where
each token continues the previous one) for trainer/attention.py.

Loss entries keep their source: for every loss token of every row, (row, position) in the row plus
the flat index of the trie node that holds it and of its parent (whose logits score it). Every
per-token array (behaviour logprobs, advantages, temperature, top-p: trainer/batch.py
`token_columns`) is gathered by (row, position), so the same token owned by its row is scored at the node that
represents it, with the owning row's numbers. Two loss entries may share a node (identical calls in
two rows): each keeps its own term, exactly as in the per-call objective.

Micro-batches hold at most `budget` forwarded tokens (a row or episode larger than the budget
still goes whole when alone). Tree packing fills bins in (episode, token order) so rows sharing a
prefix meet in one bin; an episode split over several bins forwards its shared prefix once per bin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from trainer.attention import Segment
from trainer.attention_backend import PackedAttention
from trainer.batch import MicroBatch, gather_loss_columns, trained_rows
from trainer.rows import Row

PackedLayoutName = Literal["packed", "tree"]


class _Trie:
    """Token trie over rows; one virtual root per key (a row id when packing, an episode id for trees)."""

    def __init__(self) -> None:
        self.token: list[int] = []
        self.children: list[dict[int, int]] = []
        self.roots: dict[str, int] = {}
        self.size = 0  # real (token) nodes

    def _node(self, token: int) -> int:
        self.token.append(token)
        self.children.append({})
        return len(self.token) - 1

    def common_prefix(self, key: str, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` the trie already holds under `key`."""
        node = self.roots.get(key)
        if node is None:
            return 0
        for n, tok in enumerate(ids):
            nxt = self.children[node].get(tok)
            if nxt is None:
                return n
            node = nxt
        return len(ids)

    def insert(self, key: str, ids: Sequence[int]) -> list[int]:
        """Add a row; returns the node of each of its tokens."""
        if key not in self.roots:
            self.roots[key] = self._node(-1)
        node, nodes = self.roots[key], []
        for tok in ids:
            nxt = self.children[node].get(tok)
            if nxt is None:
                nxt = self._node(tok)
                self.children[node][tok] = nxt
                self.size += 1
            nodes.append(nxt)
            node = nxt
        return nodes


@dataclass(frozen=True)
class FlatLayout:
    """One micro-batch as a flat pre-order sequence plus where each row's loss tokens are in it."""

    input_ids: np.ndarray  # int64 [N]
    position_ids: np.ndarray  # int64 [N]: depth = position in every row holding the token
    parent: np.ndarray  # int64 [N]: flat index of the previous token on the path, -1 at a root
    subtree_end: np.ndarray  # int64 [N]: k is an ancestor-or-self of q iff k <= q < subtree_end[k]
    segments: tuple[Segment, ...]
    loss_row: np.ndarray  # int64 [M]: index into the micro-batch's rows
    loss_pos: np.ndarray  # int64 [M]: position in that row
    loss_token: np.ndarray  # int64 [M]: flat index of the node holding the token
    loss_pred: np.ndarray  # int64 [M]: flat index whose logits score it (its parent)
    row_tokens: int  # tokens of the rows (what padding-free rows would forward)


def _preorder(trie: _Trie) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node order in pre-order and, per flat index: node, token, parent index, depth, subtree end."""
    n = trie.size
    node_at = np.empty(n, dtype=np.int64)
    parent = np.empty(n, dtype=np.int64)
    depth = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    flat = 0
    # Iterative DFS: (node, parent flat index, depth); children pushed reversed to visit in insert order.
    stack: list[tuple[int, int, int]] = []
    for root in reversed(list(trie.roots.values())):
        stack.extend((c, -1, 0) for c in reversed(list(trie.children[root].values())))
    open_nodes: list[int] = []  # flat indices whose subtree is still being laid out
    while stack:
        node, par, d = stack.pop()
        while open_nodes and depth[open_nodes[-1]] >= d:
            end[open_nodes.pop()] = flat
        node_at[flat], parent[flat], depth[flat] = node, par, d
        open_nodes.append(flat)
        stack.extend((c, flat, d + 1) for c in reversed(list(trie.children[node].values())))
        flat += 1
    for i in open_nodes:
        end[i] = flat
    token = np.asarray(trie.token, dtype=np.int64)[node_at]
    return node_at, token, parent, depth, end


def _segments(parent: np.ndarray) -> tuple[Segment, ...]:
    """Maximal runs where each token's parent is the token before it; context = the ancestor runs."""
    n = parent.size
    heads = np.flatnonzero((parent != np.arange(n) - 1) | (parent < 0))
    bounds = np.append(heads, n)
    seg_of = np.repeat(np.arange(heads.size), np.diff(bounds))
    out: list[Segment] = []
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        p = int(parent[s])
        context: tuple[tuple[int, int], ...] = ()
        if p >= 0:
            above = out[int(seg_of[p])]
            context = (*above.context, (above.start, p + 1))
        out.append(Segment(int(s), int(e), context))
        assert len(out) == i + 1
    return tuple(out)


def layout(rows: Sequence[Row], kind: PackedLayoutName) -> FlatLayout:
    """Lay `rows` out as one flat sequence: chains per row ("packed") or one trie per episode ("tree")."""
    trie = _Trie()
    nodes = [trie.insert(r.row_id if kind == "packed" else r.episode_id, r.input_ids.tolist()) for r in rows]
    node_at, token, parent, depth, end = _preorder(trie)
    flat_of = np.empty(len(trie.token), dtype=np.int64)
    flat_of[node_at] = np.arange(node_at.size)
    loss_row, loss_pos = [], []
    for i, row in enumerate(rows):
        pos = np.flatnonzero(row.loss_mask)
        loss_row.append(np.full(pos.size, i, dtype=np.int64))
        loss_pos.append(pos.astype(np.int64))
    lr = np.concatenate(loss_row) if rows else np.zeros(0, np.int64)
    lp = np.concatenate(loss_pos) if rows else np.zeros(0, np.int64)
    loss_token = np.asarray(
        [flat_of[nodes[r][p]] for r, p in zip(lr.tolist(), lp.tolist(), strict=True)], dtype=np.int64
    )
    return FlatLayout(
        input_ids=token,
        position_ids=depth,
        parent=parent,
        subtree_end=end,
        segments=_segments(parent),
        loss_row=lr,
        loss_pos=lp,
        loss_token=loss_token,
        loss_pred=parent[loss_token],
        row_tokens=sum(len(r.input_ids) for r in rows),
    )


def _bins_packed(rows: list[Row], budget: int) -> list[list[Row]]:
    """First-fit decreasing by length (ties by row id): deterministic, whatever the input order."""
    ordered = sorted(rows, key=lambda r: (-len(r.input_ids), r.row_id))
    bins: list[list[Row]] = []
    room: list[int] = []
    for row in ordered:
        t = len(row.input_ids)
        at = next((i for i, free in enumerate(room) if free >= t), None)
        if at is None:
            bins.append([row])
            room.append(budget - t)
        else:
            bins[at].append(row)
            room[at] -= t
    return bins


def _bins_tree(rows: list[Row], budget: int) -> list[list[Row]]:
    """Next-fit over rows in (episode, tokens, row id) order, each costing only the tokens it adds."""
    ordered = sorted(rows, key=lambda r: (r.episode_id, r.input_ids.tolist(), r.row_id))
    bins: list[list[Row]] = []
    trie, used = _Trie(), 0
    for row in ordered:
        ids = row.input_ids.tolist()
        added = len(ids) - trie.common_prefix(row.episode_id, ids)
        if bins and used + added > budget:
            trie, used = _Trie(), 0
            added = len(ids)
        if not trie.roots:
            bins.append([])
        trie.insert(row.episode_id, ids)
        bins[-1].append(row)
        used += added
    return bins


def plan_layouts(
    rows: Sequence[Row], kind: PackedLayoutName, budget: int
) -> list[tuple[list[Row], FlatLayout]]:
    """Valid rows with loss tokens -> micro-batches of at most `budget` forwarded tokens, laid out."""
    trained = trained_rows(rows)
    bins = _bins_packed(trained, budget) if kind == "packed" else _bins_tree(trained, budget)
    return [(b, layout(b, kind)) for b in bins]


def unique_prefix_tokens(rows: Sequence[Row]) -> int:
    """Distinct (episode, token prefix) pairs over the trained rows: the fewest tokens an exact
    forward can compute (two tokens with the same prefix have the same hidden state)."""
    trie = _Trie()
    for row in trained_rows(rows):
        trie.insert(row.episode_id, row.input_ids.tolist())
    return trie.size


def collate_layout(rows: Sequence[Row], flat: FlatLayout, advantages: Mapping[str, float]) -> MicroBatch:
    """A laid-out micro-batch as the learner's tensors: logits only where a loss token is scored."""
    keep = np.unique(flat.loss_pred)
    return MicroBatch(
        input_ids=torch.from_numpy(flat.input_ids)[None],
        loss_rows=torch.zeros(flat.loss_token.size, dtype=torch.int64),
        loss_positions=torch.from_numpy(flat.loss_token),
        **gather_loss_columns(rows, flat.loss_row, flat.loss_pos, advantages),
        row_ids=tuple(r.row_id for r in rows),
        real_tokens=int(flat.input_ids.size),
        loss_pred_positions=torch.from_numpy(np.searchsorted(keep, flat.loss_pred).astype(np.int64)),
        position_ids=torch.from_numpy(flat.position_ids)[None],
        attention=PackedAttention(flat.subtree_end, flat.segments),
        logit_positions=torch.from_numpy(keep),
        row_tokens=flat.row_tokens,
    )


def plan_packed_micro_batches(
    rows: Sequence[Row], advantages: Mapping[str, float], kind: PackedLayoutName, budget: int
) -> list[MicroBatch]:
    """`plan_micro_batches` for the packed and tree layouts (no validation: call validate_rows first)."""
    return [collate_layout(b, flat, advantages) for b, flat in plan_layouts(rows, kind, budget)]
