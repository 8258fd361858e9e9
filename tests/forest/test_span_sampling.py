"""Each call's sampling processing (temperature, top_p) travels receipt -> span -> rows Parquet.

Hand-written episode: a parent context whose two calls were sampled at different temperatures /
top-p (a gateway request may override the episode's sampling), and a worker at a third setting.
The spans must carry exactly the values each call was completed with, through the Parquet round
trip (float64: 0.7 stays 0.7); a trained call without a recorded processing, and a rows file
written before spans had these fields, are refused by name.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grove.sampling import SamplingProcessing
from ledger.errors import InvalidTransitionError
from tests.forest.kit import Episode, tokens
from trainer.forest import EpisodeRef, MissingSamplingError, ReconstructionOptions, reconstruct
from trainer.rows import SpanSamplingColumnsError, rows_from_parquet, rows_to_parquet

HALF = SamplingProcessing(temperature=0.5, top_p=1.0)
NUCLEUS = SamplingProcessing(temperature=0.7, top_p=0.9)
HOT = SamplingProcessing(temperature=1.3, top_p=0.95)

P1 = tokens([1, 2, 3], [10, 11, 12], [-0.1, -0.2, -0.3])
P2 = tokens([1, 2, 3, 10, 11, 12, 41], [51, 52], [-0.4, -0.5])
W1 = tokens([20, 21], [22, 23, 24], [-1.1, -1.2, -1.3])


def mixed_episode() -> Episode:
    ep = Episode()
    ep.root("p", "parent")
    ep.call("p1", "p", P1, sampling=HALF)
    ep.spawn("w", "worker-1", by="p1")
    ep.call("w1", "w", W1, sampling=HOT)
    ep.call("p2", "p", P2, extends="p1", sampling=NUCLEUS)
    ep.close()
    return ep


def spans_by_call(rows) -> dict[str, tuple[float, float]]:
    return {s.call_id: (s.temperature, s.top_p) for r in rows for s in r.spans}


def test_each_span_carries_its_own_calls_sampling_through_parquet():
    rows = mixed_episode().reconstruct().rows
    expected = {"p1": (0.5, 1.0), "p2": (0.7, 0.9), "w1": (1.3, 0.95)}
    assert spans_by_call(rows) == expected  # p1 appears in p2's row as conditioning: still its own
    back = rows_from_parquet(rows_to_parquet(rows))
    assert spans_by_call(back) == expected
    assert [r.spans for r in back] == [r.spans for r in rows]


def test_the_ledger_keeps_the_sampling_a_call_completed_with():
    ep = Episode()
    ep.root("p", "parent")
    ep.admit("p1", "p")
    assert ep.complete("p1", P1, sampling=NUCLEUS).sampling == NUCLEUS
    assert ep.complete("p1", P1, sampling=NUCLEUS).sampling == NUCLEUS  # the same completion: a no-op
    with pytest.raises(InvalidTransitionError, match="different receipt"):
        ep.complete("p1", P1, sampling=HALF)


def test_a_trained_call_without_recorded_sampling_is_refused():
    ep = mixed_episode()
    receipts = [
        r.model_copy(update={"sampling": None}) if r.call_id == "w1" else r for r in ep.ledger.receipts()
    ]
    with pytest.raises(MissingSamplingError, match="'w1' records no sampling"):
        reconstruct(EpisodeRef(episode_id="ep", group_id="grp"), receipts, ep.staged, ReconstructionOptions())


def test_rows_written_before_span_sampling_are_refused_by_name():
    rows = mixed_episode().reconstruct().rows
    table = pq.read_table(io.BytesIO(rows_to_parquet(rows)))
    old_span = pa.struct(
        [f for f in table.schema.field("spans").type.value_type if f.name not in ("temperature", "top_p")]
    )
    old_spans = [
        [{k: v for k, v in s.items() if k not in ("temperature", "top_p")} for s in row]
        for row in table.column("spans").to_pylist()
    ]
    old = table.set_column(
        table.schema.get_field_index("spans"), "spans", pa.array(old_spans, pa.list_(old_span))
    )
    sink = io.BytesIO()
    pq.write_table(old, sink)
    with pytest.raises(SpanSamplingColumnsError, match=r"no \['temperature', 'top_p'\] fields"):
        rows_from_parquet(sink.getvalue())
