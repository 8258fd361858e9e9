"""Rows -> checked, padded micro-batches of tensors for the learner.

1. `validate_rows` fails closed on anything that would silently change an action's weight: a loss
   mask that is not exactly the union of the row's owned eligible spans, an eligible call owned by
   zero or two rows of its episode, spans outside the row, behaviour logprobs that are not finite
   on loss tokens or not 0 elsewhere, a loss span without a sampling processing the learner can
   mirror (temperature in [1e-2, 100], top_p in (0, 1]).
2. `unique_eligible_tokens` is the loss denominator: the eligible completion tokens of the valid
   episodes, each call counted once however many rows contain it.
3. `plan_micro_batches` combines all valid rows of the logical batch first, then cuts them into
   micro-batches of at most `budget` padded tokens and pads each one (padding after combining).
   Rows are ordered by (length descending, row id), so the plan does not depend on input order.
   Right padding is exact without an attention mask: under causal attention a real token never
   sees the padding that follows it. Each loss token carries its span's temperature and top_p
   (per-token arrays, like its behaviour logprob): the learner scores it under them.
Invalid rows (failed-episode placeholders) carry no loss, are not forwarded and count nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
from torch import Tensor

from grove.sampling import SamplingProcessing
from trainer.attention_backend import PackedAttention
from trainer.rows import Row, Span


class RowShapeError(ValueError):
    """A row's arrays differ in length, or a span lies outside the row or starts at position 0."""


class DuplicateRowError(ValueError):
    """Two rows of the logical batch share a row id."""


class LossMaskMismatchError(ValueError):
    """A row's loss_mask is not exactly the union of its owned eligible spans."""


class OwnershipError(ValueError):
    """An eligible call is owned by no row or by several rows of its episode, or its spans disagree."""


class BehaviorLogprobError(ValueError):
    """Behaviour logprobs not finite and <= 0 on loss tokens, or not 0 off them."""


class SpanSamplingError(ValueError):
    """A loss span without a sampling processing (temperature, top_p) the learner can mirror."""


def _check_span_sampling(row: Row, s: Span) -> None:
    try:
        SamplingProcessing(temperature=s.temperature, top_p=s.top_p)
    except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
        raise SpanSamplingError(
            f"row {row.row_id!r}: loss span of call {s.call_id!r} has temperature={s.temperature} "
            f"top_p={s.top_p}; the learner scores a token only under the processing it was sampled "
            "with (temperature in [1e-2, 100], top_p in (0, 1]); rebuild the rows from receipts that "
            "record their sampling"
        ) from err


def _check_row(row: Row) -> None:
    t = len(row.input_ids)
    if t == 0 or len(row.loss_mask) != t or len(row.behavior_logprobs) != t:
        raise RowShapeError(
            f"row {row.row_id!r}: input_ids has {t} tokens, loss_mask {len(row.loss_mask)}, "
            f"behavior_logprobs {len(row.behavior_logprobs)}; all three must be equally long and non-empty"
        )
    expected = np.zeros(t, dtype=bool)
    for s in row.spans:
        if not 1 <= s.start <= s.end <= t:
            raise RowShapeError(
                f"row {row.row_id!r}: span of call {s.call_id!r} is [{s.start}, {s.end}) in a row of {t} "
                "tokens; a completion span must satisfy 1 <= start <= end <= len(input_ids)"
            )
        if s.owned and s.eligible:
            expected[s.start : s.end] = True
            _check_span_sampling(row, s)
    mask = np.asarray(row.loss_mask, dtype=bool)
    if not np.array_equal(mask, expected):
        first = int(np.flatnonzero(mask != expected)[0])
        raise LossMaskMismatchError(
            f"row {row.row_id!r}: loss_mask at position {first} is {bool(mask[first])} but the owned "
            f"eligible spans say {bool(expected[first])}; the mask must be exactly their union"
        )
    blp = np.asarray(row.behavior_logprobs, dtype=np.float64)
    on = blp[mask]
    if not (np.all(np.isfinite(on)) and np.all(on <= 0)) or np.any(blp[~mask] != 0):
        raise BehaviorLogprobError(
            f"row {row.row_id!r}: behavior_logprobs must be finite and <= 0 on the {int(mask.sum())} loss "
            "tokens and exactly 0 elsewhere (rows.py contract); check the staged call logprobs"
        )


def _check_ownership(rows: Sequence[Row]) -> None:
    owners: dict[tuple[str, str], list[str]] = {}
    lengths: dict[tuple[str, str], int] = {}
    for row in rows:
        for s in row.spans:
            if not s.eligible:
                continue
            key = (row.episode_id, s.call_id)
            if lengths.setdefault(key, s.end - s.start) != s.end - s.start:
                raise OwnershipError(
                    f"episode {key[0]!r}, call {key[1]!r}: its completion spans {lengths[key]} tokens in "
                    f"one row and {s.end - s.start} in row {row.row_id!r}; one call has one completion"
                )
            owners.setdefault(key, [])
            if s.owned:
                owners[key].append(row.row_id)
    for (episode_id, call_id), rows_owning in owners.items():
        if len(rows_owning) != 1:
            raise OwnershipError(
                f"episode {episode_id!r}, eligible call {call_id!r} is owned by {len(rows_owning)} rows "
                f"{rows_owning}; every eligible action gets loss in exactly one row (reconstruction bug)"
            )


def validate_rows(rows: Sequence[Row]) -> None:
    """Check the rows of one logical batch (see the module docstring); raises one error per kind."""
    seen: set[str] = set()
    for row in rows:
        if row.row_id in seen:
            raise DuplicateRowError(f"row id {row.row_id!r} appears twice in the batch; rows are unique")
        seen.add(row.row_id)
    valid = valid_rows(rows)
    for row in valid:
        _check_row(row)
    _check_ownership(valid)


def valid_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows of episodes whose rows are all valid (one invalid row invalidates its episode)."""
    invalid = {r.episode_id for r in rows if not r.valid}
    return [r for r in rows if r.episode_id not in invalid]


def trained_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows a step forwards: valid, with loss tokens (others add nothing to loss or gradient)."""
    return [r for r in valid_rows(rows) if r.num_loss_tokens > 0]


def unique_eligible_tokens(rows: Sequence[Row]) -> int:
    """Eligible completion tokens of the valid episodes, each (episode, call) counted once."""
    lengths: dict[tuple[str, str], int] = {}
    for row in valid_rows(rows):
        for s in row.spans:
            if s.eligible:
                lengths[(row.episode_id, s.call_id)] = s.end - s.start
    return sum(lengths.values())


@dataclass(frozen=True)
class MicroBatch:
    """One forward's tensors and its loss tokens, listed row-major over (row, position) of the rows.

    Padded layout: input_ids [B, T], token (b, t) scored by the logits at (b, t - 1).
    Packed/tree layouts (trainer/packing.py): input_ids [1, N] with `position_ids` and the ancestor
    structure (`PackedAttention`, planned for the device's attention backend at forward time); a
    token is scored by the hidden state of its parent in the flat sequence, and the LM head runs
    only at `logit_positions`.
    """

    input_ids: Tensor  # int64 [B, T], right-padded with 0 (packed: [1, N])
    loss_rows: Tensor  # int64 [N], batch index of each loss token
    loss_positions: Tensor  # int64 [N], position t of each loss token in input_ids
    behavior_logprobs: Tensor  # float32 [N]
    advantages: Tensor  # float64 [N]; the learner casts to the logprobs' dtype
    temperature: Tensor  # float64 [N], the sampling temperature of each loss token's span
    top_p: Tensor  # float64 [N], the sampling top-p of each loss token's span
    row_ids: tuple[str, ...]  # the rows whose loss tokens these are
    real_tokens: int  # tokens forwarded, padding excluded
    loss_pred_positions: Tensor | None = None  # int64 [N], index of the scoring logits (padded: None = t-1)
    position_ids: Tensor | None = None  # int64 [1, N] (packed layouts)
    attention: PackedAttention | None = None  # packed layouts: which keys each query sees
    logit_positions: Tensor | None = None  # int64 [K]: compute logits only here (packed layouts)
    row_tokens: int = 0  # tokens of the rows (= real_tokens unless a tree merged shared prefixes)
    policy_version: Tensor | None = None  # int64 [N], the version that sampled each loss token

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def pred_positions(self) -> Tensor:
        return self.loss_positions - 1 if self.loss_pred_positions is None else self.loss_pred_positions


def token_columns(row: Row, advantage: float) -> dict[str, np.ndarray]:
    """Every per-token array the loss reads, over the row's T positions (loss positions matter).

    Each layout gathers these at its loss tokens' (row, position): one place to add a column.
    """
    t = len(row.input_ids)
    temp = np.ones(t, dtype=np.float64)
    top_p = np.ones(t, dtype=np.float64)
    version = np.full(t, -1, dtype=np.int64)
    for s in row.spans:
        if s.owned and s.eligible:  # exactly the loss tokens (validate_rows checked the mask)
            temp[s.start : s.end] = s.temperature
            top_p[s.start : s.end] = s.top_p
            version[s.start : s.end] = s.policy_version
    return {
        "behavior_logprobs": np.asarray(row.behavior_logprobs, dtype=np.float32),
        "advantages": np.full(t, advantage, dtype=np.float64),
        "temperature": temp,
        "top_p": top_p,
        "policy_version": version,
    }


class LossColumns(TypedDict):
    """`token_columns` gathered at the loss tokens: MicroBatch's per-token fields, tensors [N]."""

    behavior_logprobs: Tensor
    advantages: Tensor
    temperature: Tensor
    top_p: Tensor
    policy_version: Tensor


def gather_loss_columns(
    rows: Sequence[Row], loss_row: np.ndarray, loss_pos: np.ndarray, advantages: Mapping[str, float]
) -> LossColumns:
    """`token_columns` of each loss token, by its (row index, position): tensors [N]."""
    parts: dict[str, list[np.ndarray]] = {}
    order = []
    for i, row in enumerate(rows):
        sel = np.flatnonzero(loss_row == i)
        order.append(sel)
        for name, col in token_columns(row, advantages[row.episode_id]).items():
            parts.setdefault(name, []).append(col[loss_pos[sel]])
    inverse = np.empty(loss_row.size, dtype=np.int64)
    inverse[np.concatenate(order)] = np.arange(loss_row.size)  # back to the loss tokens' order

    def column(name: str) -> Tensor:
        return torch.from_numpy(np.concatenate(parts[name])[inverse])

    return LossColumns(
        behavior_logprobs=column("behavior_logprobs"),
        advantages=column("advantages"),
        temperature=column("temperature"),
        top_p=column("top_p"),
        policy_version=column("policy_version"),
    )


def _collate(rows: Sequence[Row], advantages: Mapping[str, float]) -> MicroBatch:
    width = max(len(r.input_ids) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for b, row in enumerate(rows):
        t = len(row.input_ids)
        ids[b, :t] = row.input_ids
        mask[b, :t] = row.loss_mask
    loss_rows, loss_positions = np.nonzero(mask)  # row-major
    return MicroBatch(
        input_ids=torch.from_numpy(ids),
        loss_rows=torch.from_numpy(loss_rows.astype(np.int64)),
        loss_positions=torch.from_numpy(loss_positions.astype(np.int64)),
        **gather_loss_columns(rows, loss_rows, loss_positions, advantages),
        row_ids=tuple(r.row_id for r in rows),
        real_tokens=sum(len(r.input_ids) for r in rows),
        row_tokens=sum(len(r.input_ids) for r in rows),
    )


def plan_micro_batches(rows: Sequence[Row], advantages: Mapping[str, float], budget: int) -> list[MicroBatch]:
    """Valid rows with loss tokens -> micro-batches of at most `budget` padded tokens.

    A row longer than `budget` goes alone. Rows without loss tokens are not forwarded (they would
    add nothing to the loss or the gradient). `advantages` maps episode id -> advantage.
    No validation here: call `validate_rows` first.
    """
    trained = trained_rows(rows)
    ordered = sorted(trained, key=lambda r: (-len(r.input_ids), r.row_id))
    groups: list[list[Row]] = []
    for row in ordered:
        # Sorted by length descending, so a group's first row sets its padded width.
        if groups and (len(groups[-1]) + 1) * len(groups[-1][0].input_ids) <= budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [_collate(g, advantages) for g in groups]
