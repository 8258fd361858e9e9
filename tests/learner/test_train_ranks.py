"""The train_step activity on N rank processes (LearnerConfig.ranks > 1, activities/train_ranks.py).

Every step here goes through the activity's own code (`TrainerActivities._train_ranks`: download,
launch, supervise, upload, COMMIT), with real rank processes (gloo, FSDP2) and a real LocalStore; only
the Temporal activity context is absent (tests/durability/test_trainer_ranks.py runs it on real
services). Rank processes are slow to start on the shared 2-core machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from activities.train_ranks import RANK_GATE, RankLostError, rank_gate_key
from activities.training import TrainerActivities
from grove.contracts import TrainStepInput
from grove.gates import ENV, GateControl
from grove.learner_config import LearnerConfig
from grove.store_layout import checkpoint_prefix
from storage.local import LocalStore
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT
from tests.durability.helpers import wait_exited
from tests.learner.test_reference import controlled_batch, rows_of
from tests.learner.weight_gap import relative_gap
from trainer.checkpoint import (
    CheckpointConfigMismatchError,
    download_model_folder,
    load_checkpoint,
    read_manifest,
    read_trainer_state,
    save_checkpoint,
)
from trainer.learner import Learner, StepMetrics
from trainer.rows import rows_to_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

ROOT = Path(__file__).resolve().parents[2]
ROWS_KEY = "rows/batch.parquet"
CFG = LearnerConfig(lr=1e-3, layout="packed", micro_batch_tokens=64, ranks=2)
# Another split of the micro-batches over ranks sums the gradient in another float32 order; AdamW's
# first steps divide by sqrt(v), which amplifies that noise on tiny entries; it stays far below the
# tolerance over the whole model (relative_gap; docs/results.md section 4).
# A double update or a lost micro-batch moves it by ~1.
RANK_COUNT_TOLERANCE = 1e-4


def batch_rows():
    return rows_of(controlled_batch(512))


def step_input(run_id: str, step: int, model: Path, cfg: LearnerConfig = CFG) -> TrainStepInput:
    return TrainStepInput(run_id=run_id, step=step, model=str(model), row_keys=[ROWS_KEY], learner=cfg)


def new_store(root: Path) -> LocalStore:
    store = LocalStore(root / "store")
    store.put(ROWS_KEY, rows_to_parquet(batch_rows()))
    return store


def copy_step(store: LocalStore, run_from: str, run_to: str, step: int) -> None:
    """A committed step of one run as the same step of another (to branch a run onto other ranks)."""
    for key in store.list(checkpoint_prefix(run_from, step)):
        store.put(
            checkpoint_prefix(run_to, step) + key[len(checkpoint_prefix(run_from, step)) :], store.get(key)
        )


def saved_weights(store: LocalStore, run_id: str, step: int, dest: Path) -> dict[str, torch.Tensor]:
    return load_file(download_model_folder(store, run_id, step, dest) / "model.safetensors")


def single_process_weights(model: Path, steps: int) -> dict[str, torch.Tensor]:
    learner = Learner(model, CFG.model_copy(update={"ranks": 1}), device="cpu")
    for _ in range(steps):
        learner.step(batch_rows())
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def torchrun_weights(model: Path, steps: int, out: Path) -> dict[str, torch.Tensor]:
    """Two ranks taking `steps` steps in one process each, never leaving memory (the uninterrupted run)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "tests/learner/distributed_worker.py"),
    ]
    subprocess.run(
        [*cmd, str(model), CFG.layout, str(out), str(steps)],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=PROCESS_WAIT,
    )
    return torch.load(out, weights_only=False)["weights"]


def optimizer_steps(store: LocalStore, run_id: str, step: int, dest: Path) -> set[float]:
    """AdamW's per-parameter step counters of a committed step, read back in one process."""
    learner = load_checkpoint(store, run_id, step, CFG.model_copy(update={"ranks": 1}), dest, device="cpu")
    return {float(s["step"]) for s in learner.optimizer.state_dict()["state"].values()}


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, learner_model_dir):
    """Run "a": steps 1 and 2, each on 2 rank processes through the activity (resumed from step 1's
    sharded checkpoint by construction: nothing stays in memory between steps)."""
    root = tmp_path_factory.mktemp("ranks")
    store = new_store(root)
    acts = TrainerActivities(store, root / "work", device="cpu", rank_threads=1)
    metrics = [asyncio.run(acts._train_ranks(step_input("a", s, learner_model_dir))) for s in (1, 2)]
    return root, store, metrics


def test_two_ranks_resumed_equal_uninterrupted_ranks_bit_for_bit_and_one_process(
    two_rank_run, learner_model_dir
):
    root, store, metrics = two_rank_run
    manifest = read_manifest(store, "a", 2)
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(manifest)
    assert "optimizer.pt" not in manifest
    state = read_trainer_state(store, "a", 2)
    assert (state.step, state.ranks, state.optimizer_format) == (2, 2, "sharded")
    assert [m["step"] for m in metrics] == [1, 2]

    got = saved_weights(store, "a", 2, root / "dl-a2")
    base = load_file(learner_model_dir / "model.safetensors")
    uninterrupted = torchrun_weights(learner_model_dir, 2, root / "torchrun.pt")
    different = [k for k in got if not torch.equal(got[k], uninterrupted[k])]
    assert not different, f"resumed 2-rank weights differ from the uninterrupted 2-rank run in {different}"
    single = single_process_weights(learner_model_dir, 2)
    assert relative_gap(got, single, base) <= RANK_COUNT_TOLERANCE
    # each step updated the optimizer once: a second update would move AdamW's counters and weights
    assert optimizer_steps(store, "a", 2, root / "opt-a2") == {2.0}

    # the checkpoint is a model folder transformers (and so vLLM, which reads the same files) loads
    folder = download_model_folder(store, "a", 2, root / "hf-a2")
    # the tensors of the base folder, no more (a tied lm_head written twice is refused by vLLM)
    assert sorted(load_file(folder / "model.safetensors")) == sorted(base)
    # vLLM picks its model class by config.json `architectures`: the base's, not FSDP's generated class
    base_config = json.loads((learner_model_dir / "config.json").read_text())
    assert json.loads((folder / "config.json").read_text())["architectures"] == base_config["architectures"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], got[k]) for k in got)


def test_sharded_checkpoint_resumes_onto_other_rank_counts(two_rank_run, learner_model_dir):
    root, store, _ = two_rank_run
    expected = saved_weights(store, "a", 2, root / "dl-x2")
    base = load_file(learner_model_dir / "model.safetensors")
    acts = TrainerActivities(store, root / "work-b", device="cpu", rank_threads=1)

    # 2 ranks -> 3 ranks: DCP reshards the AdamW state
    copy_step(store, "a", "b", 1)
    asyncio.run(acts._train_ranks(step_input("b", 2, learner_model_dir, CFG.model_copy(update={"ranks": 3}))))
    assert read_trainer_state(store, "b", 2).ranks == 3
    assert relative_gap(saved_weights(store, "b", 2, root / "dl-b2"), expected, base) <= RANK_COUNT_TOLERANCE
    assert optimizer_steps(store, "b", 2, root / "opt-b2") == {2.0}

    # 2 ranks -> 1 process (the default engine): load_checkpoint reads the shards without a process group
    one = load_checkpoint(store, "a", 1, CFG.model_copy(update={"ranks": 1}), root / "one", device="cpu")
    one.step(batch_rows())
    assert relative_gap(one.model.state_dict(), expected, base) <= RANK_COUNT_TOLERANCE

    # 1 process -> 2 ranks: every rank loads the whole optimizer.pt into its shard
    first = Learner(learner_model_dir, CFG.model_copy(update={"ranks": 1}), device="cpu")
    first.step(batch_rows())
    save_checkpoint(store, "c", first)
    assert "optimizer.pt" in read_manifest(store, "c", 1)
    asyncio.run(acts._train_ranks(step_input("c", 2, learner_model_dir)))
    assert relative_gap(saved_weights(store, "c", 2, root / "dl-c2"), expected, base) <= RANK_COUNT_TOLERANCE
    assert optimizer_steps(store, "c", 2, root / "opt-c2") == {2.0}

    # another learner config is still refused, before any rank starts
    with pytest.raises(CheckpointConfigMismatchError, match="lr"):
        asyncio.run(
            acts._train_ranks(step_input("a", 2, learner_model_dir, CFG.model_copy(update={"lr": 2e-3})))
        )


async def _wait_for_held(gates: GateControl, keys: list[str], task: asyncio.Task) -> None:
    """Until every key is held at the rank gate (the ranks announce it; bounded by the test timeout)."""
    while not set(keys) <= set(gates.held(RANK_GATE)):
        if task.done():
            task.result()  # an attempt that ended before reaching the gate: surface why
            raise AssertionError(f"the attempt ended before {keys} were held")
        await asyncio.sleep(0.05)


def test_a_rank_killed_mid_step_loses_the_attempt_and_the_retry_trains_once(
    two_rank_run, learner_model_dir, tmp_path, monkeypatch
):
    root, store_a, _ = two_rank_run
    store = new_store(tmp_path)
    gates = GateControl(tmp_path / "gates")
    monkeypatch.setenv(ENV, str(gates.root))  # the rank processes inherit it
    keys = [rank_gate_key("d", 1, rank, 0) for rank in (0, 1)]
    gates.arm(RANK_GATE, r"^d/step-000001/rank-\d/pass-0$")
    acts = TrainerActivities(store, tmp_path / "work", device="cpu", rank_threads=1)

    async def attempt_with_a_dead_rank() -> tuple[list[int], str]:
        task = asyncio.create_task(acts._train_ranks(step_input("d", 1, learner_model_dir)))
        await _wait_for_held(gates, keys, task)  # both ranks hold after their first backward pass
        pids = [gates.holder(RANK_GATE, key) for key in keys]
        os.kill(pids[1], signal.SIGKILL)
        gates.disarm(RANK_GATE)  # rank 0 goes on into a collective with a dead peer
        with pytest.raises(RankLostError) as err:
            await task
        return pids, str(err.value)

    pids, message = asyncio.run(attempt_with_a_dead_rank())
    assert "rank 1 of 2 was killed by SIGKILL" in message
    wait_exited(pids, timeout=5)  # raises if a rank outlived its failed attempt
    assert store.list(checkpoint_prefix("d", 1)) == []  # nothing of the lost attempt reached the store

    # the retry (what Temporal does next) trains the step exactly once
    asyncio.run(acts._train_ranks(step_input("d", 1, learner_model_dir)))
    assert optimizer_steps(store, "d", 1, tmp_path / "opt-d1") == {1.0}
    once = saved_weights(store, "d", 1, tmp_path / "dl-d1")
    reference = saved_weights(store_a, "a", 1, tmp_path / "dl-a1")  # an attempt nobody killed
    assert all(torch.equal(once[k], reference[k]) for k in reference)


def test_cancelling_an_attempt_kills_and_reaps_its_ranks(learner_model_dir, tmp_path, monkeypatch):
    store = new_store(tmp_path)
    gates = GateControl(tmp_path / "gates")
    monkeypatch.setenv(ENV, str(gates.root))
    keys = [rank_gate_key("e", 1, rank, 0) for rank in (0, 1)]
    gates.arm(RANK_GATE, r"^e/step-000001/rank-\d/pass-0$")  # held mid-step until the test is done
    acts = TrainerActivities(store, tmp_path / "work", device="cpu", rank_threads=1)

    async def cancel_mid_step() -> list[int]:
        task = asyncio.create_task(acts._train_ranks(step_input("e", 1, learner_model_dir)))
        await _wait_for_held(gates, keys, task)
        pids = [gates.holder(RANK_GATE, key) for key in keys]
        task.cancel()  # what a cancelled train_step does to its attempt
        with pytest.raises(asyncio.CancelledError):
            await task
        return pids

    pids = asyncio.run(cancel_mid_step())
    wait_exited(pids, timeout=5)  # both ranks were killed and reaped by the supervisor, still held
    assert store.list(checkpoint_prefix("e", 1)) == []
    assert not list((tmp_path / "work").iterdir())  # the attempt folder is gone too


# Truncated-IS cap of the stale-token test: below the default (2.0), so a rank path that dropped the
# run's cap would train the capped tokens with another weight.
IS_CAP = 1.5


def stale_rows() -> list:
    """The test batch for step 2 (updating version 1): episode ctrl-0 (advantage +1) sampled by version
    0, ctrl-1 (advantage -1) by version 0 with behaviour logprobs 9 nats lower (its IS weights exceed
    the cap and are truncated), ctrl-2 by version 1 (lag 0). The behaviour logprobs (-0.1..-3) are far
    above the tiny model's (~ -6): lag-0 tokens train with the PPO-clipped ratio, stale ones with
    the IS weight and no behaviour clip, so the two surrogates differ on every stale token."""
    out = []
    for row in batch_rows():
        version = 0 if row.episode_id in ("ctrl-0", "ctrl-1") else 1
        spans = tuple(dataclasses.replace(s, policy_version=version) for s in row.spans)
        behaviour = row.behavior_logprobs
        if row.episode_id == "ctrl-1":
            behaviour = np.where(row.loss_mask, behaviour - 9.0, 0.0).astype(np.float32)
        out.append(dataclasses.replace(row, spans=spans, behavior_logprobs=behaviour))
    return out


def test_stale_tokens_on_two_ranks_get_the_single_process_truncated_is(learner_model_dir, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put(ROWS_KEY, rows_to_parquet(stale_rows()))
    first = Learner(learner_model_dir, CFG.model_copy(update={"ranks": 1}), device="cpu")
    first.step(batch_rows())  # step 1 (version 1), committed in one process
    save_checkpoint(store, "s", first)
    base = saved_weights(store, "s", 1, tmp_path / "dl-s1")
    acts = TrainerActivities(store, tmp_path / "work", device="cpu", rank_threads=1)
    inp = step_input("s", 2, learner_model_dir).model_copy(
        update={"max_policy_lag": 1, "off_policy_is_cap": IS_CAP}
    )
    metrics = asyncio.run(acts._train_ranks(inp))
    assert (metrics["lag_tokens_0"], metrics["lag_tokens_1"]) == (
        sum(r.num_loss_tokens for r in batch_rows() if r.episode_id == "ctrl-2"),
        sum(r.num_loss_tokens for r in batch_rows() if r.episode_id != "ctrl-2"),
    )
    got = saved_weights(store, "s", 2, tmp_path / "dl-s2")

    def one_process(rows: list, is_cap: float) -> tuple[StepMetrics, dict[str, torch.Tensor]]:
        """Step 2 in one process from the same commit (load_checkpoint: weights, AdamW, counters)."""
        dest = Path(tempfile.mkdtemp(dir=tmp_path))
        learner = load_checkpoint(store, "s", 1, CFG.model_copy(update={"ranks": 1}), dest, device="cpu")
        learner.is_cap = is_cap
        step = learner.step(rows)
        return step, {k: v.detach().clone() for k, v in learner.model.state_dict().items()}

    step, single = one_process(stale_rows(), IS_CAP)
    loss = step.loss
    assert metrics["loss"] == pytest.approx(loss, rel=1e-6)
    # the ranks report the stale tokens as one process does: all of ctrl-1's truncated, none of ctrl-0's
    truncated = sum(r.num_loss_tokens for r in batch_rows() if r.episode_id == "ctrl-1")
    assert metrics["stale_tokens"] == step.stale_tokens == metrics["lag_tokens_1"]
    assert metrics["is_truncated_frac"] == step.is_truncated_frac == truncated / step.stale_tokens
    assert metrics["is_weight_mean"] == pytest.approx(step.is_weight_mean, rel=1e-6)
    assert relative_gap(got, single, base) <= RANK_COUNT_TOLERANCE
    # The test can fail: the same rows without the correction (every token at lag 0), or with the
    # default cap, train weights far outside the tolerance.
    at_lag_zero = [
        dataclasses.replace(r, spans=tuple(dataclasses.replace(s, policy_version=1) for s in r.spans))
        for r in stale_rows()
    ]
    gaps = []
    for rows, cap in ((at_lag_zero, IS_CAP), (stale_rows(), 2.0)):
        other_step, other = one_process(rows, cap)
        other_loss = other_step.loss
        assert abs(other_loss - loss) > 1e-3 * abs(loss)
        gaps.append(relative_gap(got, other, base))
        assert gaps[-1] > 100 * RANK_COUNT_TOLERANCE
    gap = relative_gap(got, single, base)
    print(
        f"stale tokens, 2 ranks vs one process: gap {gap:.3g}; vs no correction "
        f"{gaps[0]:.3g}, vs cap 2.0 {gaps[1]:.3g}"
    )
