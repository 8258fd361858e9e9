"""The LangGraph example (examples/langgraph_supervisor.py) against real services: the real gateway
(uvicorn), the Temporal dev server, a grove worker with a real vLLM engine on the tiny model.

The graph knows nothing of grove beyond its chat model; the test checks what grove inferred (agents,
spawn links, the summary as auxiliary, the worker's rewrite) from the workflow's ledger, what the engine
really served (exact continuations), and the published rows (each action owned once, workers' answers
masked where they enter the parent's context, no row for the summary call).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from grove.receipts import ContextOrigin
from harnesses.clients.langgraph import GroveGraphs
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import (  # noqa: F401  (gateway_url is a fixture)
    contexts,
    extension_of,
    gateway_url,
    summary,
)
from tests.harnesses.framework_kit import external_episode, published_rows

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_supervisor.py"


def load_example():
    spec = importlib.util.spec_from_file_location("langgraph_supervisor", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # LangGraph reads the state's type hints through the module
    spec.loader.exec_module(module)
    return module


async def test_supervisor_with_send_workers_and_summarization(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
    e2e_store,
):
    example = load_example()
    eid, episode = await external_episode(temporal_client, gateway_url, "langgraph")
    grove = GroveGraphs(episode)
    answer = await example.run(grove, max_tokens=12)

    ctx = contexts(await summary(temporal_client, eid))
    # the supervisor is the root agent; each Send task a worker spawned by the parent's first call
    assert ctx["parent.0"].origin == ContextOrigin.ROOT and ctx["parent.0"].head == "parent.0.c1"
    for w in ("worker-1", "worker-2"):
        assert ctx[f"{w}.0"].origin == ContextOrigin.SPAWN
        assert ctx[f"{w}.0"].spawned_by_call == "parent.0.c0"
    # exactly one worker compacted: an auxiliary summary call, then a declared rewrite of its context
    compacted = [w for w in ("worker-1", "worker-2") if f"{w}.1" in ctx]
    assert len(compacted) == 1, sorted(ctx)
    [w] = compacted
    [plain] = {"worker-1", "worker-2"} - {w}
    assert ctx[f"{w}.1"].origin == ContextOrigin.REWRITE and ctx[f"{w}.1"].rewrite_of == f"{w}.0"
    assert ctx[f"{w}.0"].retired_by == f"{w}.1" and f"{w}~summary.0" in ctx
    assert f"{plain}.1" not in ctx and f"{plain}~summary.0" not in ctx
    assert {c.agent for c in ctx.values()} == {"parent", "worker-1", "worker-2", f"{w}~summary"}
    assert not (await summary(temporal_client, eid)).warnings  # no agent without a spawn link
    # exact continuations, read from what the engine served
    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
    assert extension_of(recording_engine, eid, f"{plain}.0.c1", f"{plain}.0.c0")

    close = await grove.aclose(final_answer=answer, wait=True)
    result = close["result"]
    assert result["status"] == "ok", result
    # parent 2 + plain worker 2 + compacting worker (1 before, 1 after the rewrite); the summary aside
    assert result["counts"] == {"selected": 6, "auxiliary": 1}

    rows = published_rows(e2e_store, result["rows_key"])
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    actions = {"parent.0.c0", "parent.0.c1", f"{plain}.0.c0", f"{plain}.0.c1", f"{w}.0.c0", f"{w}.1.c0"}
    assert sorted(owned) == sorted(actions)  # every action owned exactly once, the summary in no row
    served = recording_engine.calls_of(eid)
    for row in rows:
        mask = np.zeros_like(row.loss_mask)
        for s in row.spans:
            if s.owned:
                assert s.end - s.start == served[s.call_id].completion_ids.size
                mask[s.start : s.end] = True
        np.testing.assert_array_equal(row.loss_mask, mask)  # loss only on owned completions
    [parent_row] = [r for r in rows if r.spans[-1].call_id == "parent.0.c1"]
    assert {s.agent for s in parent_row.spans} == {"parent"}  # workers' reports: observations there
    last = served["parent.0.c1"]
    np.testing.assert_array_equal(
        parent_row.input_ids, np.concatenate([last.prompt_ids, last.completion_ids])
    )
