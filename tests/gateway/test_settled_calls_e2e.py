"""A call that names a settled call is refused through the gateway before anything is admitted.

A long episode's hand-over settles every call older than its context's branch window (ledger/settlement.py
`settle`): the call stays in the ledger pages and is trained as the close decides, but nothing may build
on it any more. Through the real gateway the way a harness reaches an old call is a worker whose request
names its spawner (`x-grove-spawned-by`): spawned by a settled call it gets 409 `SettledCallError`, whose
message says which call, which context, the window and what to do, and nothing is opened or admitted; a
worker spawned by the head is served. Real services (the fixtures of test_app_e2e.py): uvicorn, the
Temporal dev server, a grove worker with vLLM on the tiny model, a local store.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import openai
import pytest

from grove import queues
from grove.contracts import EpisodeProgress, EpisodeResult, EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from ledger.accounting import LedgerSummary
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.gateway.test_app_e2e import (  # noqa: F401  (gateway_url is a fixture)
    SYSTEM,
    assistant_of,
    close,
    contexts,
    gateway_url,
    oai,
    summary,
)

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

WINDOW = 2


async def _start(client) -> str:
    run = f"gws-settled-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=2),
        # a hand-over every 4 Updates, the ledger paged (and so settled) from 3 items
        max_updates_per_run=4, ledger_page_items=2, branch_window=WINDOW,
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


async def quiet_summary(client, episode_id: str) -> LedgerSummary:
    """The summary once the episode is quiet: its hand-over done, its ledger restored whole in the new
    run, and every response the client got recorded delivered (the gateway records a delivery after the
    last part went out, so the client holds its answer a moment before). Each stays once reached while
    no request comes."""
    handle = client.get_workflow_handle(episode_id)
    deadline = time.monotonic() + STATE_WAIT
    while True:
        progress = await handle.query("progress", result_type=EpisodeProgress)
        restored = progress.restore is None or progress.restore.pages_done == progress.restore.pages_total
        if not progress.handing_over and restored:
            s = await summary(client, episode_id)
            if s.contexts and not any(c.awaiting_delivery for c in s.contexts):
                return s
        if time.monotonic() > deadline:
            raise AssertionError(f"episode {episode_id!r} not quiet after {STATE_WAIT} s: {progress}")
        await asyncio.sleep(0.05)


async def _chat(client: openai.AsyncOpenAI, messages: list) -> tuple[dict, str]:
    raw = await client.chat.completions.with_raw_response.create(model="grove-tiny", messages=messages)
    return assistant_of(raw.parse().choices[0].message), raw.headers["x-grove-call-id"]


async def test_a_worker_spawned_by_a_settled_call_is_refused_409_and_nothing_is_admitted(
    gateway_url,  # noqa: F811
    temporal_client,
):
    eid = await _start(temporal_client)
    parent = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "Plan, then delegate."}]
    ids = []
    for i in range(8):  # open_context + 8 calls: hand-overs after the 4th and the 8th Update
        reply, call_id = await _chat(parent, messages)
        ids.append(call_id)
        messages = [*messages, reply, {"role": "user", "content": f"Go on ({i})."}]
    progress = await temporal_client.get_workflow_handle(eid).query("progress")
    assert progress["run_index"] >= 2
    before = await quiet_summary(temporal_client, eid)
    assert sum(before.totals.values()) == 8 and set(contexts(before)) == {"parent.0"}

    settled = ids[0]
    worker = oai(gateway_url, eid, **{"x-grove-agent": "counter", "x-grove-spawned-by": settled})
    task = [SYSTEM, {"role": "user", "content": "Count the a's in banana."}]
    with pytest.raises(openai.ConflictError) as refused:
        await _chat(worker, task)
    assert refused.value.status_code == 409 and refused.value.code == "SettledCallError"
    text = refused.value.message
    window = f"branch_window={WINDOW}"
    for needed in (eid, settled, "context 'parent.0'", window, ids[-1], "EpisodeSpec.branch_window"):
        assert needed in text, (needed, text)
    after = await summary(temporal_client, eid)
    assert after == before  # refused before admission: no context opened, no call admitted

    # a worker spawned by a call of the window is served
    worker = oai(gateway_url, eid, **{"x-grove-agent": "counter", "x-grove-spawned-by": ids[-1]})
    _, call_id = await _chat(worker, task)
    assert call_id == "counter.0.c0"
    assert contexts(await summary(temporal_client, eid))["counter.0"].spawned_by_call == ids[-1]
    response = await close(gateway_url, eid, {"final_answer": "done"}, wait=False)
    assert response.status_code < 300, response.text
    result = await temporal_client.get_workflow_handle(eid, result_type=EpisodeResult).result()
    assert result.status == "ok", result.failure
    assert result.counts == {"selected": 9}  # every call, the settled ones too
