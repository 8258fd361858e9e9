"""Per-request sampling reaches the learner: real gateway capture, real ledger, real vLLM, real learner.

One external episode whose spec samples at T=0.5; its three chat requests go through the gateway's
real `Capture` (continuation detection, exact splice), the real `generate` activity on the engine
serving the tiny model, and a real `Ledger` (the same admit / generate / complete steps as
EpisodeWorkflow.call, in-process instead of through Temporal). The second and third requests
override the sampling (T=1.3 with top_p=0.8, then top_p=0.9 at the episode's T=0.5). The ledger is
closed, the forest reconstructed, the rows sent through Parquet, and the learner's `prepare_batch` /
`score_tokens` score them with the weights vLLM sampled with: the importance ratio must be 1 for
every token (within the float32 agreement of vLLM and torch, 1e-4). Scored under one run-wide T=1.0
instead of each span's own sampling, the ratios are far from 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from temporalio.testing import ActivityEnvironment

from activities.inference_worker import InferenceActivities
from gateway.intake.chat_request import parse_chat_request
from gateway.pipeline.capture import Capture
from grove.contracts import CallRequest, CallResult, EpisodeSpec, GenerateInput, HarnessSpec, TaskSpec
from grove.learner_config import LearnerConfig
from grove.receipts import ContextRecord
from grove.sampling import SamplingConfig, SamplingProcessing
from grove.staging_format import decode_call_tokens
from ledger.context_view import ContextView, ViewRequest, context_view
from ledger.delivery import delivery_refusal, record_delivery
from ledger.ledger import Ledger
from trainer.forest import EpisodeRef, ReconstructionOptions, reconstruct
from trainer.learner import load_policy, prepare_batch, score_tokens
from trainer.rows import rows_from_parquet, rows_to_parquet

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

TOL = 1e-4  # |vLLM - learner| processed logprobs in float32 on CPU (tests/inference/test_engine.py)
CPU = torch.device("cpu")
EPISODE = "ep-sampling"


class LedgerEpisodes:
    """The gateway's `Episodes` over a real Ledger and the real generate activity (no Temporal)."""

    def __init__(self, spec: EpisodeSpec, acts: InferenceActivities) -> None:
        self._spec, self.acts = spec, acts
        self.ledger = Ledger(episode_id=spec.episode_id, group_id=spec.group_id)

    async def spec(self, episode_id: str) -> EpisodeSpec:
        return self._spec

    async def context_view(self, episode_id: str, req: ViewRequest) -> ContextView:
        return context_view(self.ledger, req, closing=False)

    async def delivery_refusal(self, episode_id: str, call_id: str) -> str:
        return delivery_refusal(self.ledger, call_id, closing=False)

    async def deliver(self, episode_id: str, call_id: str) -> None:
        record_delivery(self.ledger, call_id)

    async def open_context(self, episode_id: str, record: ContextRecord) -> ContextRecord:
        return self.ledger.open_context(record)

    async def discard(self, episode_id: str, call_id: str, reason: str) -> None:
        self.ledger.discard(call_id, reason)

    async def call(self, episode_id: str, req: CallRequest) -> CallResult:
        # EpisodeWorkflow.call: admit, generate (the activity), complete with what it returned.
        self.ledger.admit(
            req.call_id, req.context_id, kind=req.kind, extends=req.extends, branch=req.branch,
            awaits_delivery=req.await_delivery,
        )  # fmt: skip
        inp = GenerateInput(
            episode_id=episode_id,
            call_id=req.call_id,
            prompt=req.prompt,
            sampling=req.sampling or self._spec.sampling,
        )
        r = await ActivityEnvironment().run(self.acts.generate, inp)
        self.ledger.complete(
            req.call_id, r.staging_key, r.digests, r.policy_version, r.finish_reason, sampling=r.sampling
        )
        return CallResult(
            call_id=req.call_id, completion_ids=r.completion_ids, text=r.text,
            assistant_message=r.assistant_message, finish_reason=r.finish_reason,
            policy_version=r.policy_version, digests=r.digests, staging_key=r.staging_key,
        )  # fmt: skip


async def test_mixed_per_request_sampling_gives_ratio_one_for_every_token(policy_engine, store):
    spec = EpisodeSpec(
        run_id="r", step=0, group_id="g", episode_id=EPISODE, task=TaskSpec(family="chat", task_id="t"),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(temperature=0.5, max_tokens=24),
    )  # fmt: skip
    episodes = LedgerEpisodes(spec, InferenceActivities(policy_engine, store))
    capture = Capture(episodes, store)
    model = "tiny"
    messages = [{"role": "user", "content": "Tell me about the weather in Oslo."}]
    overrides = [{}, {"temperature": 1.3, "top_p": 0.8}, {"top_p": 0.9}]
    follow_ups = ["And in Bergen?", "What should I wear?"]
    records = []
    for i, extra in enumerate(overrides):
        request = parse_chat_request({"model": model, "messages": messages, **extra}, model)
        record = await capture.chat(EPISODE, request, {})
        records.append(record)
        if i < len(follow_ups):
            messages = [*messages, record.response, {"role": "user", "content": follow_ups[i]}]
    assert [r.extends for r in records] == [None, records[0].call_id, records[1].call_id]  # one context

    ledger = episodes.ledger
    ledger.close()
    expected = [(0.5, 1.0), (1.3, 0.8), (0.5, 0.9)]
    receipts = {r.call_id: r for r in ledger.receipts()}
    assert [receipts[r.call_id].sampling for r in records] == [
        SamplingProcessing(temperature=t, top_p=p) for t, p in expected
    ]
    tokens = {c: decode_call_tokens(store.get(r.staging_key)) for c, r in receipts.items()}
    rec = reconstruct(EpisodeRef(episode_id=EPISODE, group_id="g"), list(receipts.values()), tokens,
                      ReconstructionOptions(), reward=1.0)  # fmt: skip
    rows = rows_from_parquet(rows_to_parquet(rec.rows))
    assert len(rows) == 1
    assert [(s.temperature, s.top_p) for s in rows[0].spans] == expected

    policy = load_policy(policy_engine.source_dir, CPU, trainable=False)

    def run_wide(mb):  # every token at T=1.0, top_p=1.0: the learner before spans carried sampling
        return dataclasses.replace(
            mb, temperature=torch.ones_like(mb.temperature), top_p=torch.ones_like(mb.top_p)
        )

    n = sum(tokens[r.call_id].completion_ids.size for r in records)
    for layout in ("padded", "packed", "tree"):  # the learner's layouts gather the same per-token columns
        cfg = LearnerConfig(layout=layout)
        batch = prepare_batch(rows, cfg)
        with torch.no_grad():
            logp = torch.cat([score_tokens(policy, mb, cfg, CPU) for mb in batch.plan])
            old = torch.cat([score_tokens(policy, run_wide(mb), cfg, CPU) for mb in batch.plan])
        behaviour = torch.cat([mb.behavior_logprobs for mb in batch.plan]).double()
        ratio = torch.exp(logp.double() - behaviour).numpy()
        old_ratio = torch.exp(old.double() - behaviour).numpy()
        assert ratio.size == batch.denominator == n
        print(
            f"{layout}: {ratio.size} tokens; ratio per span: [{ratio.min():.6f}, {ratio.max():.6f}]; "
            f"scored at one T=1.0: [{old_ratio.min():.3f}, {old_ratio.max():.3f}]"
        )
        assert np.abs(ratio - 1).max() <= TOL, (layout, ratio)
        assert np.abs(old_ratio - 1).max() > 0.05
