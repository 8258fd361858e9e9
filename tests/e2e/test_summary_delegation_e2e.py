"""The `summary-delegation` family on real services (Temporal dev server, vLLM on the tiny model, store).

Two episodes of one task, one with summaries trained and one without: each worker's summary call is
served in its own context, settles auxiliary, comes back into the worker's rewritten context as
conditioning, is counted in the episode's result, and gets loss in exactly one row only when trained.
Expectations come from what the engine served, never from the rows' own spans.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from grove import queues
from grove.contracts import EpisodeResult, EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import summary_delegation
from tests.bounds import SERVICE_TEST_TIMEOUT
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SUMMARY_CALLS = ("worker-1.0.c0", "worker-2.0.c0")  # each worker's first call is its summary
CALLS = {"parent.0.c0", "parent.0.c1", *SUMMARY_CALLS, "worker-1.1.c0", "worker-2.1.c0"}


async def run_episode(client, train_auxiliary: list[str]) -> EpisodeResult:
    from workflows.episode import EpisodeWorkflow

    eid = f"sumdel-{uuid.uuid4().hex[:6]}/s000000/t0/g0"
    spec = EpisodeSpec(
        run_id="sumdel", step=0, group_id="sumdel/g", episode_id=eid, task=summary_delegation.make_task(3),
        harness=HarnessSpec(program=summary_delegation.FAMILY), sampling=SamplingConfig(max_tokens=8),
        train_auxiliary=train_auxiliary,
    )  # fmt: skip
    return await client.execute_workflow(EpisodeWorkflow.run, spec, id=eid, task_queue=queues.EPISODES)


@pytest.mark.parametrize("trained", [True, False], ids=["summaries-trained", "summaries-not-trained"])
async def test_each_workers_summary_is_trained_once_only_when_the_run_says_so(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir, trained
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    result = await run_episode(temporal_client, ["summary"] if trained else [])
    served = recording_engine.calls_of(result.episode_id)
    assert set(served) == CALLS and result.status == "ok"
    assert result.counts == {"selected": 4, "auxiliary": 2}  # the summaries settle auxiliary
    assert result.call_stats["summary_calls"] == 2 and result.call_stats["rewrite_contexts"] == 2
    summary_tokens = sum(served[c].completion_ids.size for c in SUMMARY_CALLS)
    assert (result.summary_calls_trained, result.summary_tokens_trained) == (
        (2, summary_tokens) if trained else (0, 0)
    )
    assert set(result.reward_details) == {"summary", "workers", "parent"}
    rows = rows_from_parquet(e2e_store.get(result.rows_key))
    for c in SUMMARY_CALLS:  # the rewritten context starts from the summary's text: conditioning
        rewrite = served[c.replace(".0.c0", ".1.c0")]
        text = tok.decode(served[c].completion_ids, skip_special_tokens=True).strip()
        shown = tok.decode(rewrite.prompt_ids, skip_special_tokens=True)
        assert text in shown.split("Summary:", 1)[1], (text, shown)
        s = served[c]
        loss_rows = [
            r
            for r in rows
            if r.input_ids.size >= s.prompt_ids.size + s.completion_ids.size
            and np.array_equal(r.input_ids[: s.prompt_ids.size], s.prompt_ids)
            and r.loss_mask[s.prompt_ids.size : s.prompt_ids.size + s.completion_ids.size].all()
        ]
        assert len(loss_rows) == (1 if trained else 0), c
        if trained:
            start = s.prompt_ids.size
            np.testing.assert_array_equal(loss_rows[0].behavior_logprobs[start:], s.logprobs)
    assert result.eligible_tokens == sum(r.num_loss_tokens for r in rows)
    actions = sum(served[c].completion_ids.size for c in CALLS - set(SUMMARY_CALLS))
    assert result.eligible_tokens == actions + (summary_tokens if trained else 0)
