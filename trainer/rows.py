"""Training rows: the reconstruction's output and the learner's input, and their Parquet form.

A row is one physical training sequence: the root-to-endpoint path of selected calls of one context
lineage, laid out as the endpoint call's prompt followed by its completion.

Columns (one Parquet record per row; list columns hold the per-token arrays):

| column            | type           | meaning |
| ----------------- | -------------- | ------- |
| row_id            | string         | `{episode_id}#{endpoint call_id}` |
| episode_id        | string         | the owner: the logical rollout this row belongs to |
| group_id          | string         | the GRPO group of the owner |
| input_ids         | list<int32>    | [T] the exact tokens the policy saw and sampled on the path |
| loss_mask         | list<bool>     | [T] True only on completion tokens of eligible calls owned here |
| behavior_logprobs | list<float32>  | [T] sampling logprobs on loss positions; 0 where loss_mask is False |
| spans             | list<struct>   | per call on the path: call_id, agent, start, end (where its |
|                   |                | completion is in input_ids), owned, eligible, policy_version, |
|                   |                | temperature, top_p (float64: the sampling processing the call |
|                   |                | was generated with; the learner scores the span under it) |
| reward            | float64        | the owner episode's reward (same value on all its rows) |
| valid             | bool           | False: a failed episode's placeholder row (no loss; keeps its group) |

Position convention: the token at position t was sampled given input_ids[:t], so the learner scores
position t with the logits at t-1. A completion span therefore never starts at 0.

Rows Parquet written before spans carried temperature/top_p cannot be scored faithfully (nobody knows
what they were sampled with): reading one raises `SpanSamplingColumnsError`; re-materialize it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


class SpanSamplingColumnsError(ValueError):
    """A rows table whose span struct lacks the per-span sampling fields (temperature, top_p)."""


@dataclass(frozen=True)
class Span:
    """Where one call's completion sits in a row."""

    call_id: str
    agent: str
    start: int
    end: int
    owned: bool  # this row carries the loss of the call (exactly one row per eligible call)
    eligible: bool  # selected action call that the run trains (agent filter, auxiliary option)
    policy_version: int
    # Sampling processing of the call (grove/receipts.py CallReceipt.sampling); None only in spans
    # built by hand: the learner refuses to score a loss span without it (trainer/batch.py).
    temperature: float | None = None
    top_p: float | None = None


SPAN_SAMPLING_FIELDS = ("temperature", "top_p")


@dataclass(frozen=True)
class Row:
    """One physical training sequence; arrays are numpy, one entry per token."""

    row_id: str
    episode_id: str
    group_id: str
    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # bool [T]
    behavior_logprobs: np.ndarray  # float32 [T]
    spans: tuple[Span, ...] = field(default=())
    reward: float = 0.0
    valid: bool = True

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


SPAN_TYPE = pa.struct(
    [
        ("call_id", pa.string()),
        ("agent", pa.string()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("owned", pa.bool_()),
        ("eligible", pa.bool_()),
        ("policy_version", pa.int64()),
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
    ]
)

ROW_SCHEMA = pa.schema(
    [
        ("row_id", pa.string()),
        ("episode_id", pa.string()),
        ("group_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.bool_())),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("spans", pa.list_(SPAN_TYPE)),
        ("reward", pa.float64()),
        ("valid", pa.bool_()),
    ]
)


def rows_to_table(rows: list[Row]) -> pa.Table:
    """Rows -> Arrow table with ROW_SCHEMA (row order preserved)."""
    return pa.table(
        {
            "row_id": [r.row_id for r in rows],
            "episode_id": [r.episode_id for r in rows],
            "group_id": [r.group_id for r in rows],
            "input_ids": [r.input_ids.astype(np.int32, copy=False) for r in rows],
            "loss_mask": [r.loss_mask.astype(np.bool_, copy=False) for r in rows],
            "behavior_logprobs": [r.behavior_logprobs.astype(np.float32, copy=False) for r in rows],
            "spans": [[s.__dict__ for s in r.spans] for r in rows],
            "reward": [float(r.reward) for r in rows],
            "valid": [bool(r.valid) for r in rows],
        },
        schema=ROW_SCHEMA,
    )


def _check_span_fields(table: pa.Table) -> None:
    span_type = table.schema.field("spans").type.value_type
    missing = [f for f in SPAN_SAMPLING_FIELDS if span_type.get_field_index(f) < 0]
    if missing:
        raise SpanSamplingColumnsError(
            f"this rows table's spans have no {missing} fields: it was written before grove recorded "
            "each call's sampling processing, so its tokens cannot be scored as they were sampled; "
            "re-materialize the episode (or re-run it) with this version"
        )


def table_to_rows(table: pa.Table) -> list[Row]:
    """Arrow table (ROW_SCHEMA) -> rows; SpanSamplingColumnsError for tables without span sampling."""
    if table.num_rows:
        _check_span_fields(table)
    cols = table.to_pydict()
    return [
        Row(
            row_id=cols["row_id"][i],
            episode_id=cols["episode_id"][i],
            group_id=cols["group_id"][i],
            input_ids=np.asarray(cols["input_ids"][i], dtype=np.int32),
            loss_mask=np.asarray(cols["loss_mask"][i], dtype=np.bool_),
            behavior_logprobs=np.asarray(cols["behavior_logprobs"][i], dtype=np.float32),
            spans=tuple(Span(**s) for s in cols["spans"][i]),
            reward=cols["reward"][i],
            valid=cols["valid"][i],
        )
        for i in range(table.num_rows)
    ]


def rows_to_parquet(rows: list[Row]) -> bytes:
    """Deterministic Parquet bytes for `rows` (same rows -> same bytes, for verify-if-present writes)."""
    sink = io.BytesIO()
    pq.write_table(rows_to_table(rows), sink, compression="zstd", write_statistics=False)
    return sink.getvalue()


def rows_from_parquet(data: bytes) -> list[Row]:
    return table_to_rows(pq.read_table(io.BytesIO(data)))
