"""SIGKILL the trainer worker in the middle of step 2's `train_step`: the step's checkpoint is either
absent (then committed by the retry on a new trainer) or committed (then reused), never half-visible,
and the final weights equal those of an uninterrupted learner on the same rows.

The trainer queue runs in its own `grove worker --queues trainer` process. The kill lands inside the
activity by construction: `train_step` saves the checkpoint after the optimizer step, its files in
sorted order and the COMMIT marker last, and the trainer's `store_put` gate (grove/gates.py) holds it
right after the first file (model/config.json) is written, until the test has killed it: in the
middle of the checkpoint write, leaving a partial, uncommitted step behind. The history then shows
train_step of step 2 started twice (attempt 2 after the 60 s heartbeat timeout).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid

import pytest
import torch
from safetensors.torch import load_file

from grove import queues
from grove.contracts import HarnessSpec, RunConfig, RunResult, RunState, TrainStepInput, TrainStepResult
from grove.learner_config import LearnerConfig
from grove.sampling import SamplingConfig
from grove.store_layout import checkpoint_prefix, commit_key
from harnesses import scenario
from storage.local import LocalStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT
from tests.durability.helpers import (
    activity_attempts,
    activity_results,
    decoded_inputs,
    is_started,
    pending_activities,
    wait_held,
)
from trainer.checkpoint import (
    CheckpointNotFoundError,
    download_model_folder,
    latest_committed_step,
    read_manifest,
)
from trainer.learner import Learner
from trainer.rows import rows_from_parquet
from workflows.training_run import TrainingRunWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

TASKS_PER_STEP, GROUP_SIZE = 1, 2
KILL_STEP = 2
# What train_step writes beside the checkpoint, before it (activities/training.py metrics_key, episodes_key)
SIDECARS = ("metrics.json", "episodes.json")
FIRST_CHECKPOINT_FILE = "model/config.json"  # save_checkpoint writes files in sorted order, COMMIT last


def run_config(model: str) -> RunConfig:
    return RunConfig(
        run_id=f"dur-trainer-kill-{uuid.uuid4().hex[:6]}", model=model, seed=3, steps=2,
        task_family=scenario.NAME, num_tasks=4, tasks_per_step=TASKS_PER_STEP, group_size=GROUP_SIZE,
        harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
        learner=LearnerConfig(lr=1e-2),
    )  # fmt: skip


def check_committed(store: LocalStore, run_id: str, step: int) -> dict[str, str]:
    """A COMMIT's manifest names files that all exist with that sha256 (hashed here, independently)."""
    manifest = read_manifest(store, run_id, step)
    assert manifest, f"step {step}: empty manifest"
    for name, sha in manifest.items():
        data = (store.root / checkpoint_prefix(run_id, step) / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha, (
            f"step {step}: {name} differs from its COMMIT manifest"
        )
    return manifest


@pytest.mark.long  # minutes on 2 cores: the `long` suite (.ci/run runs it)
async def test_trainer_sigkill_mid_step_never_half_visible_and_same_weights(stack, tmp_path):
    await stack.up()
    client, store = stack.client, LocalStore(stack.store_dir)
    cfg = run_config(str(stack.model))
    stack.gates.clear("store_put")
    first_key = checkpoint_prefix(cfg.run_id, KILL_STEP) + FIRST_CHECKPOINT_FILE
    stack.gates.arm("store_put", f"^{re.escape(first_key)}$")
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip
    what = f"step {KILL_STEP}'s train_step held after writing {first_key}"
    assert await wait_held(stack, "store_put", 1, what) == [first_key]
    stack.trainer.kill()
    stack.gates.disarm("store_put")  # the retry on the new trainer writes through
    # the server still sees step 2's train_step started (attempt 1) on the trainer that just died
    [pending] = [a for a in await pending_activities(handle) if a.activity_type.name == "train_step"]
    assert is_started(pending) and pending.attempt == 1

    # at the crash: the step's first file is written and the step is invisible to readers
    committed_at_kill = store.exists(commit_key(cfg.run_id, KILL_STEP))
    assert not committed_at_kill
    assert store.exists(first_key)
    assert latest_committed_step(store, cfg.run_id) == KILL_STEP - 1
    with pytest.raises(CheckpointNotFoundError):
        read_manifest(store, cfg.run_id, KILL_STEP)
    left = store.list(checkpoint_prefix(cfg.run_id, KILL_STEP))
    print(f"at the kill: committed={committed_at_kill}, objects {left}")

    stack.trainer.start()
    await stack.trainer.wait_ready(client)
    run = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    assert [h.step for h in run.history] == [1, 2]

    # the kill landed inside the activity: it ran again, and reused the checkpoint iff it was committed
    assert await activity_attempts(handle, "train_step") == [1, 2]
    results = await activity_results(client, handle, "train_step", TrainStepResult)
    assert [(r.step, r.reused_checkpoint) for r in results] == [(1, False), (2, committed_at_kill)]
    for step in (1, 2):
        manifest = check_committed(store, cfg.run_id, step)
        leftovers = set(store.list(checkpoint_prefix(cfg.run_id, step))) - {
            checkpoint_prefix(cfg.run_id, step) + n for n in [*manifest, "COMMIT", *SIDECARS]
        }
        assert not leftovers, leftovers
        assert run.history[step - 1].metrics["rollouts"] == GROUP_SIZE * TASKS_PER_STEP

    # the final weights are those of one uninterrupted learner on the same rows, steps 1 then 2
    trained = await decoded_inputs(client, handle, "train_step", TrainStepInput)
    assert [t.step for t in trained] == [1, 2]
    learner = Learner(stack.model, cfg.learner, device="cpu")
    for t in trained:
        learner.step([row for key in t.row_keys for row in rows_from_parquet(store.get(key))])
    expected = learner.model.state_dict()
    saved = load_file(download_model_folder(store, cfg.run_id, 2, tmp_path / "step-2") / "model.safetensors")
    base = load_file(stack.model / "model.safetensors")
    assert saved.keys() <= expected.keys() and saved
    assert any(not torch.equal(saved[k], base[k]) for k in saved)  # it trained at all
    worst = max((saved[k] - expected[k]).abs().max().item() for k in saved)
    assert worst == 0.0, f"final weights differ from an uninterrupted run by up to {worst:.3g}"
