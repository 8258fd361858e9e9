"""The generate activity heartbeats through every phase of a call, not only while the engine generates.

The episode takes 20 s without a heartbeat for a dead worker: the attempt is discarded as lost and the
call re-admitted. In the 20,000-call bench one call of a live worker was discarded that way (its attempt
sent no heartbeat in 20.05 s while the same worker finished 125 other calls; docs/reliability.md): the
activity heartbeated only around `engine.generate`, so a store read, the prompt build or a staging write
(fsyncs) stalled in its thread looked like a dead worker. Here the staging write is held by a test gate
(grove/gates.py, `store_before_put`) and the call keeps heartbeating, its phase in the details.

Real vLLM engine (tiny model), the real generate activity, a local store behind the gated store.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.testing import ActivityEnvironment

from activities.generate import HEARTBEAT_SECONDS
from activities.inference_worker import InferenceActivities
from grove.contracts import ChatPrompt, GenerateInput, PromptSpec
from grove.gates import GateControl, GatedStore, Gates
from grove.sampling import SamplingConfig
from grove.store_layout import staging_key
from storage.local import LocalStore

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

POINT = "store_before_put"


async def test_a_stalled_staging_write_keeps_the_call_heartbeating(policy_engine, tmp_path):
    gates = GateControl(tmp_path / "gates")
    store = GatedStore(LocalStore(tmp_path / "store"), Gates(tmp_path / "gates"))
    acts = InferenceActivities(policy_engine, store)
    gates.arm(POINT, r"/c0\.receipt-")  # the call's first staging write, after its generation
    beats: list[dict] = []
    while_held = asyncio.Event()

    def on_heartbeat(*details) -> None:
        beats.append(details[0])
        if sum(b["phase"] == "staging" for b in beats) >= 2:  # the phase's own, then a periodic one
            while_held.set()

    env = ActivityEnvironment()
    env.on_heartbeat = on_heartbeat
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    inp = GenerateInput(
        episode_id="ep-beat", call_id="c0", prompt=PromptSpec(chat=ChatPrompt(messages=messages)),
        sampling=SamplingConfig(max_tokens=4),
    )  # fmt: skip
    job = asyncio.create_task(env.run(acts.generate, inp))
    try:
        # each heartbeat comes HEARTBEAT_SECONDS after the one before: generous for a loaded machine
        await asyncio.wait_for(while_held.wait(), timeout=12 * HEARTBEAT_SECONDS)
        [held] = gates.held(POINT)
        assert held.startswith("staging/ep-beat/c0.receipt-")
        assert store.stat(staging_key("ep-beat", "c0")) is None  # nothing staged while held
    finally:
        gates.disarm(POINT)
    result = await job
    assert store.stat(result.staging_key) is not None
    phases = [b["phase"] for b in beats]
    assert phases[0] == "preparing" and "generating" in phases and phases[-1] == "staging", phases
    assert all(b["call_id"] == "c0" for b in beats)
    generating = next(b for b in beats if b["phase"] == "generating")
    staging = next(b for b in beats if b["phase"] == "staging")
    assert generating["prompt_len"] > 0 and staging["completion_len"] == len(result.completion_ids)
