"""Engines follow their run (activities/follow.py), real engine and store, through the generate activity.

- An engine serving another lineage (another run, or the start-up weights after a (re)start) loads the
  run's latest committed checkpoint before it serves the run's first call; the call reports that
  version and its behaviour logprobs are those of that checkpoint's weights.
- A checkpoint committed later reaches the engine at its next call of the run (no publication needed).
- A call that needs a version the run has not committed is refused, non-retryable, naming it.
- The run workflow's own publication of a version older than one a call already loaded is a no-op.
- An evaluation's call (pinned: min = max = its step's version) is served by exactly that version even
  when the run has committed a newer one, and refused, naming it, by an engine already past it.
- Version 0 of a run is the base model the trainer host staged in the store (trainer/base_model.py):
  not the engine's own start-up weights, and not the folder the run names (on another host).
"""

from __future__ import annotations

import numpy as np
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.inference_worker import InferenceActivities
from grove.contracts import GenerateInput, PolicyRef, PromptSpec, PublishInput
from grove.sampling import SamplingConfig
from grove.staging_format import decode_call_tokens
from grove.store_layout import staging_key
from tests.inference.checkpoints import commit_checkpoint, perturbed_copy
from tests.inference.reference import learner_logprobs
from trainer.base_model import stage_base_model

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

SAMPLING = SamplingConfig(max_tokens=12, ignore_eos=True)
TOL = 1e-4


def prompt_of(engine) -> list[int]:
    text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


async def call(
    acts, engine, run_id: str, call_id: str, min_version: int, max_version: int | None = None, **ref_fields
):
    ref = PolicyRef(run_id=run_id, min_version=min_version, max_version=max_version, **ref_fields)
    inp = GenerateInput(
        episode_id=f"{run_id}/s1/t0/g0", call_id=call_id, prompt=PromptSpec(ids=prompt_of(engine)),
        sampling=SAMPLING, policy=ref,
    )  # fmt: skip
    return await ActivityEnvironment().run(acts.generate, inp)


def max_diff(store, result, folder, engine) -> float:
    staged = decode_call_tokens(store.get(result.staging_key))
    ref = learner_logprobs(folder, prompt_of(engine), staged.completion_ids)
    return float(np.abs(ref - staged.logprobs).max())


async def test_an_engine_loads_the_runs_latest_committed_policy_before_serving(
    policy_engine, store, tmp_path
):
    base = policy_engine.source_dir
    v1 = perturbed_copy(base, tmp_path / "v1", seed=31, scale=0.05)
    v2 = perturbed_copy(base, tmp_path / "v2", seed=32, scale=0.05)
    commit_checkpoint(store, "follow-a", 1, v1)
    commit_checkpoint(store, "follow-a", 2, v2)
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")

    # The engine serves another lineage; the call allows version >= 1 and 2 is the latest committed.
    first = await call(acts, policy_engine, "follow-a", "c0", min_version=1)
    assert first.policy_version == 2 and policy_engine.run_id == "follow-a"
    assert max_diff(store, first, v2, policy_engine) <= TOL

    # Checkpoint 3 commits: the next call of the run loads it before it is served.
    v3 = perturbed_copy(base, tmp_path / "v3", seed=33, scale=0.05)
    commit_checkpoint(store, "follow-a", 3, v3)
    second = await call(acts, policy_engine, "follow-a", "c1", min_version=1)
    assert second.policy_version == 3 and max_diff(store, second, v3, policy_engine) <= TOL
    assert max_diff(store, second, v2, policy_engine) > 1e-2  # the versions really differ

    # The run's own (late) publication of version 2 does not move the engine back.
    pub = await ActivityEnvironment().run(acts.publish_weights, PublishInput(run_id="follow-a", version=2))
    assert pub.version == 3 and policy_engine.version == 3


async def test_a_call_needing_an_uncommitted_version_is_refused(policy_engine, store, tmp_path):
    commit_checkpoint(store, "follow-b", 1, policy_engine.source_dir)
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")
    with pytest.raises(ApplicationError) as err:
        await call(acts, policy_engine, "follow-b", "c0", min_version=4)
    assert err.value.type == "PolicyNotCommittedError" and err.value.non_retryable
    assert "follow-b" in str(err.value) and "version >= 4" in str(err.value)


async def test_an_evaluation_call_is_served_by_exactly_the_version_it_names(policy_engine, store, tmp_path):
    base = policy_engine.source_dir
    v1 = perturbed_copy(base, tmp_path / "v1", seed=41, scale=0.05)
    v2 = perturbed_copy(base, tmp_path / "v2", seed=42, scale=0.05)
    commit_checkpoint(store, "follow-eval", 1, v1)
    commit_checkpoint(store, "follow-eval", 2, v2)  # an overlapped run committed step 2 meanwhile
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")

    # step 1's evaluation: version 1's weights, not the newer committed 2
    ev = await call(acts, policy_engine, "follow-eval", "e0", min_version=1, max_version=1)
    assert ev.policy_version == 1 and policy_engine.version == 1
    assert max_diff(store, ev, v1, policy_engine) <= TOL
    assert max_diff(store, ev, v2, policy_engine) > 1e-2  # the versions really differ

    # a training call of the run (no cap) moves the engine on to 2 ...
    train = await call(acts, policy_engine, "follow-eval", "c0", min_version=1)
    assert train.policy_version == 2 and max_diff(store, train, v2, policy_engine) <= TOL
    # ... after which it cannot serve version 1 any more: the evaluation's call is refused, not re-scored
    with pytest.raises(ApplicationError) as err:
        await call(acts, policy_engine, "follow-eval", "e1", min_version=1, max_version=1)
    assert err.value.type == "PolicyVersionPassedError" and err.value.non_retryable
    assert "follow-eval" in str(err.value) and "version <= 1" in str(err.value), err.value
    assert not store.exists(staging_key("follow-eval/s1/t0/g0", "e1"))  # nothing staged for it


async def test_version_0_is_the_base_model_staged_in_the_store(policy_engine, store, tmp_path):
    own = policy_engine.source_dir  # what this engine serves now (its start-up weights, or a later version)
    staged = perturbed_copy(own, tmp_path / "trainer-host-model", seed=51, scale=0.05)
    stage_base_model(store, "follow-base", staged, str(staged))
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")

    # the run names its model by a folder of the trainer host's: not on this one
    first = await call(
        acts, policy_engine, "follow-base", "c0", 0, base_model=str(tmp_path / "on-another-host")
    )
    assert first.policy_version == 0 and policy_engine.run_id == "follow-base"
    assert max_diff(store, first, staged, policy_engine) <= TOL
    assert max_diff(store, first, own, policy_engine) > 1e-2  # not the engine's own weights
    assert policy_engine.source_dir == tmp_path / "weights" / "follow-base" / "step-000000"  # its own disk
