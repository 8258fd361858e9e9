"""Weight publication into the running engine: versions, exact new weights, CPU pitfalls, rollback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.engine as engine_module
from activities.engine_errors import (
    PublishFailedError,
    StaleVersionError,
    VersionConflictError,
    WeightsMismatchError,
)
from activities.inference_worker import InferenceActivities
from grove.contracts import PublishInput
from grove.gates import GateControl, Gates
from grove.sampling import SamplingConfig
from tests.inference.checkpoints import commit_checkpoint, perturbed_copy
from tests.inference.reference import learner_logprobs

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

TOL = 1e-4
SAMPLING = SamplingConfig(max_tokens=24, ignore_eos=True)


def prompt_ids(engine) -> list[int]:
    text = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


async def max_diff_to(engine, folder: Path, seed: int, tag: str, prompt=None) -> tuple[float, int]:
    """(max |engine logprobs - learner logprobs under `folder`|, version the call reported)."""
    prompt = prompt or prompt_ids(engine)
    gen = await engine.generate(prompt, SAMPLING, seed, f"{tag}-{seed}")
    ref = learner_logprobs(folder, prompt, gen.completion_ids)
    return float(np.abs(ref - gen.logprobs).max()), gen.policy_version


async def test_publish_activity_loads_a_committed_checkpoint(policy_engine, store, tmp_path):
    old_version, old_dir = policy_engine.version, policy_engine.source_dir
    new_dir = perturbed_copy(old_dir, tmp_path / "new", seed=1, scale=0.05)
    step = old_version + 1
    commit_checkpoint(store, "run-a", step, new_dir)
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")

    result = await ActivityEnvironment().run(acts.publish_weights, PublishInput(run_id="run-a", version=step))

    assert (result.version, result.previous_version) == (step, old_version)
    assert policy_engine.version == step
    assert policy_engine.source_dir == tmp_path / "weights" / "run-a" / f"step-{step:06d}"
    diff_new, version = await max_diff_to(policy_engine, new_dir, 11, "after-publish")
    diff_old, _ = await max_diff_to(policy_engine, old_dir, 12, "old-check")
    assert version == step
    assert diff_new <= TOL, diff_new
    assert diff_old > 1e-2, "the new weights should change the logprobs"
    print(f"publish activity (download + reload + repack): {result.seconds * 1e3:.1f} ms")

    # A retried publication of the same checkpoint is a no-op.
    again = await ActivityEnvironment().run(acts.publish_weights, PublishInput(run_id="run-a", version=step))
    assert (again.version, again.previous_version) == (step, step)


async def test_tied_embedding_head_is_repacked(policy_engine, tmp_path):
    """Only the (tied) embedding changes. vLLM's own reload leaves the CPU-packed LM head stale; grove's
    publication repacks it, so the logprobs follow the new embedding matrix."""
    base = policy_engine.source_dir
    emb_only = perturbed_copy(base, tmp_path / "emb", seed=2, scale=0.05, only="embed_tokens")
    # The pitfall exists on this build: plain reload_weights (no repack) gives stale logits.
    await policy_engine._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(emb_only)})
    await policy_engine._llm.reset_prefix_cache()
    stale, _ = await max_diff_to(policy_engine, emb_only, 21, "no-repack")
    assert stale > 1e-2, f"without repack the logprobs should be stale, diff {stale:.2e}"

    report = await policy_engine.publish(emb_only, policy_engine.version + 1)

    assert "lm_head" in report.repacked
    fixed, version = await max_diff_to(policy_engine, emb_only, 22, "repacked")
    assert version == report.version
    assert fixed <= TOL, fixed
    print(
        f"stale head diff {stale:.3f}, after grove publish {fixed:.1e}; "
        f"reload {report.reload_seconds * 1e3:.1f} ms"
    )


async def test_versions_only_move_forward(policy_engine, store, tmp_path):
    source = policy_engine.source_dir
    # a version to be stale against, whatever earlier tests left the shared engine at
    await policy_engine.publish(source, policy_engine.version + 1)
    current = policy_engine.version
    other = perturbed_copy(source, tmp_path / "other", seed=3)
    with pytest.raises(StaleVersionError, match=f"already serves version {current}"):
        await policy_engine.publish(other, current - 1)
    with pytest.raises(VersionConflictError, match=f"policy version {current} is already served"):
        await policy_engine.publish(other, current)
    same = await policy_engine.publish(source, current)
    assert same.already_current and policy_engine.version == current

    relabel = await policy_engine.publish(source, current, run_id="run-b")  # same weights: no reload
    assert relabel.already_current and policy_engine.run_id == "run-b"
    commit_checkpoint(store, "run-b", current - 1, other)
    commit_checkpoint(store, "run-b", current, other)
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")
    # Through the activity, the run's own older publication arrives after a call of the run made the
    # engine load a newer committed version (activities/follow.py): it is answered as already served,
    # and the engine keeps the newer weights.
    late = await ActivityEnvironment().run(
        acts.publish_weights, PublishInput(run_id="run-b", version=current - 1)
    )
    assert (late.version, late.previous_version) == (current, current)
    # The served version number with other weights is refused: a non-retryable ApplicationError
    # naming the error type (a retry cannot make the two weight sets one).
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.publish_weights, PublishInput(run_id="run-b", version=current))
    assert err.value.type == "VersionConflictError" and err.value.non_retryable
    assert (policy_engine.version, policy_engine.run_id) == (current, "run-b")
    diff, version = await max_diff_to(policy_engine, source, 43, "after-late-publications")
    assert version == current and diff <= TOL


async def test_checkpoint_of_another_architecture_is_refused(policy_engine, tmp_path):
    current = policy_engine.version
    partial = perturbed_copy(
        policy_engine.source_dir, tmp_path / "partial", seed=4, drop="model.layers.0.mlp.up_proj.weight"
    )
    with pytest.raises(WeightsMismatchError, match=r"missing \['model.layers.0.mlp.up_proj.weight'\]"):
        await policy_engine.publish(partial, current + 1)
    assert policy_engine.version == current
    diff, version = await max_diff_to(policy_engine, policy_engine.source_dir, 41, "after-refusal")
    assert version == current and diff <= TOL


async def test_failure_inside_the_reload_rolls_back(policy_engine, tmp_path, monkeypatch):
    """A tensor vLLM cannot place fails the reload half-way (layers on the meta device); the
    engine reloads its previous weights and keeps serving them."""
    current, source = policy_engine.version, policy_engine.source_dir
    bad = perturbed_copy(source, tmp_path / "bad", seed=5, add="model.layers.3.mlp.bogus.weight")
    monkeypatch.setattr(engine_module, "check_same_tensors", lambda *args: None)  # let it reach vLLM

    with pytest.raises(PublishFailedError, match="rolled back to version"):
        await policy_engine.publish(bad, current + 1)

    assert policy_engine.version == current and policy_engine.source_dir == source
    diff, version = await max_diff_to(policy_engine, source, 51, "after-rollback")
    assert version == current and diff <= TOL


async def test_calls_in_flight_finish_under_the_version_they_started_with(
    policy_engine, tmp_path, monkeypatch
):
    """Four calls held in flight by the engine's `generate` gate (grove/gates.py) while a publication
    starts: it waits for them, a call arriving meanwhile waits for it. Every moment is created by the
    test (held calls, a closed version gate), none is caught by timing."""
    old_version, old_dir = policy_engine.version, policy_engine.source_dir
    new_dir = perturbed_copy(old_dir, tmp_path / "next", seed=6)
    prompt = prompt_ids(policy_engine)
    long = SamplingConfig(max_tokens=64, ignore_eos=True)
    control = GateControl(tmp_path / "gates")
    monkeypatch.setattr(policy_engine, "_gates", Gates(control.root))
    control.arm("generate", "^inflight-")
    before = [asyncio.create_task(policy_engine.generate(prompt, long, s, f"inflight-{s}")) for s in range(4)]
    await until(lambda: len(control.held("generate")) == 4, before)  # sampled, held inside the gate
    assert policy_engine.in_flight == 4
    publish = asyncio.create_task(policy_engine.publish(new_dir, old_version + 1))
    await until(lambda: policy_engine.publishing, [publish])  # the gate is closed, the drain waits
    during = asyncio.create_task(policy_engine.generate(prompt, SAMPLING, 99, "during-publish"))
    await asyncio.sleep(0)  # let it reach the closed gate
    assert not publish.done() and not during.done()
    control.disarm("generate")  # the held calls return; the publication proceeds

    report = await publish
    old_gens = await asyncio.gather(*before)
    new_gen = await during

    assert report.drain_seconds > 0.0  # publication waited for the calls in flight
    for gen in old_gens:
        assert gen.policy_version == old_version and gen.completion_ids.size == 64
        ref = learner_logprobs(old_dir, prompt, gen.completion_ids)
        assert float(np.abs(ref - gen.logprobs).max()) <= TOL
    assert new_gen.policy_version == old_version + 1
    ref = learner_logprobs(new_dir, prompt, new_gen.completion_ids)
    assert float(np.abs(ref - new_gen.logprobs).max()) <= TOL
    print(
        f"publish with 4 calls in flight: {report.seconds * 1e3:.0f} ms "
        f"(drain {report.drain_seconds * 1e3:.0f} ms,"
        f" reload {report.reload_seconds * 1e3:.0f} ms)"
    )


async def until(condition, tasks, timeout: float = 60.0) -> None:
    """Until `condition()` holds: a state that stays once reached (held calls, a closed gate). Fails at
    once if one of `tasks` ended first (its error), and after `timeout` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        for t in tasks:
            if t.done():
                t.result()
                raise AssertionError(f"{t} finished before the awaited state")
        assert asyncio.get_running_loop().time() < deadline, "the awaited state never came"
        await asyncio.sleep(0.005)


async def test_prefix_cache_does_not_serve_stale_keys_and_values(policy_engine, tmp_path):
    """A long prompt cached under the old weights (CPU block size 128) is recomputed after a publication."""
    text = " ".join(f"Line {i}: the weather in Oslo is cold and 12 + {i} = {12 + i}." for i in range(30))
    prompt = policy_engine.tokenizer(text, add_special_tokens=False)["input_ids"][:400]
    old_dir = policy_engine.source_dir
    await policy_engine.generate(prompt, SAMPLING, 61, "cache-warm")
    policy_engine.batch_stats.reset()
    await policy_engine.generate(prompt, SAMPLING, 62, "cache-hit")
    assert policy_engine.batch_stats.prefix_cache_hits >= 256, "the prompt should be served from the cache"

    new_dir = perturbed_copy(old_dir, tmp_path / "cache", seed=7)
    await policy_engine.publish(new_dir, policy_engine.version + 1)
    diff, _ = await max_diff_to(policy_engine, new_dir, 63, "cache-after", prompt=prompt)
    assert diff <= TOL, f"stale prefix cache: diff {diff:.2e}"


async def test_publishing_an_uncommitted_checkpoint_is_refused(policy_engine, store, tmp_path):
    acts = InferenceActivities(policy_engine, store, weights_root=tmp_path / "weights")
    version = policy_engine.version
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            acts.publish_weights, PublishInput(run_id="no-run", version=version + 1)
        )
    assert err.value.type == "CheckpointNotFoundError" and err.value.non_retryable
    assert f"publish_weights no-run version {version + 1}" in str(err.value)
    assert (
        policy_engine.version == version
        and not (tmp_path / "weights" / "no-run" / f"step-{version + 1:06d}").exists()
    )
