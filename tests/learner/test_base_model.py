"""The run's base model in the store (trainer/base_model.py): staged once by the trainer host, then the
learner of step 1 and its KL reference start from those bytes on a trainer host that never had the folder
`RunConfig.model` names (no shared filesystem needed).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.training import TrainerActivities
from grove.contracts.training import StageBaseModelInput
from grove.store_layout import base_model_prefix
from models.registry import ModelResolutionError
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.inference.checkpoints import perturbed_copy
from tests.learner.test_reference import controlled_batch, rows_of
from tests.learner.test_train_kl import ROWS_KEY, step_input  # a KL penalty: the reference is the base too
from tests.learner.test_train_kl import activities as trainer
from trainer.base_model import base_manifest, download_base_model, stage_base_model
from trainer.checkpoint import CheckpointCorruptError, read_manifest
from trainer.rows import rows_to_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


def hashes(folder: Path) -> dict[str, str]:
    return {
        f"model/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()
    }


def test_staging_commits_the_folder_once_and_downloads_are_verified(learner_model_dir, tmp_path):
    store = LocalStore(tmp_path / "store")
    assert base_manifest(store, "run-a") is None
    manifest, written = stage_base_model(store, "run-a", learner_model_dir, "tiny-random")
    assert written and manifest == hashes(learner_model_dir) == base_manifest(store, "run-a")
    assert set(store.list(base_model_prefix("run-a"))) == {
        base_model_prefix("run-a") + n for n in [*manifest, "COMMIT"]
    }

    # staged again from other bytes (a retry on another host whose folder differs): the commit stands
    other = perturbed_copy(learner_model_dir, tmp_path / "other", seed=1)
    assert stage_base_model(store, "run-a", other, "tiny-random") == (manifest, False)
    down = download_base_model(store, "run-a", manifest, tmp_path / "down")
    assert hashes(down) == manifest

    store.put(base_model_prefix("run-a") + "model/model.safetensors", b"changed after the commit")
    with pytest.raises(CheckpointCorruptError, match="changed after commit"):
        download_base_model(store, "run-a", manifest, tmp_path / "down-again")


def test_a_trainer_host_without_the_folder_trains_from_the_staged_base(learner_model_dir, tmp_path):
    rows = rows_to_parquet(rows_of(controlled_batch(512)))
    store, reference_store = LocalStore(tmp_path / "store"), LocalStore(tmp_path / "reference-store")
    for s in (store, reference_store):
        s.put(ROWS_KEY, rows)
    folder = Path(shutil.copytree(learner_model_dir, tmp_path / "first-host" / "model"))
    staged = trainer(store, tmp_path / "work-a")._stage(StageBaseModelInput(run_id="kl", model=str(folder)))
    assert staged.written and staged.files == len(hashes(learner_model_dir))
    shutil.rmtree(folder)  # the next trainer host has no such folder

    first = trainer(store, tmp_path / "work-b")._train(step_input(1, folder))
    second = trainer(store, tmp_path / "work-c")._train(step_input(2, folder))  # resumed: reference again
    # the same steps from the folder itself, on a store with no staged base (how runs trained before)
    want_first = trainer(reference_store, tmp_path / "work-d")._train(step_input(1, learner_model_dir))
    want_second = trainer(reference_store, tmp_path / "work-e")._train(step_input(2, learner_model_dir))
    for got, want in ((first, want_first), (second, want_second)):
        assert {k: got[k] for k in ("loss", "kl", "grad_norm")} == {
            k: want[k] for k in ("loss", "kl", "grad_norm")
        }
    assert second["kl"] > 0.0  # measured against the staged start model, not the resumed checkpoint
    weights = [
        {k: v for k, v in read_manifest(s, "kl", 2).items() if k.startswith("model/")}
        for s in (store, reference_store)
    ]
    assert weights[0] == weights[1]

    # without a staged base the missing folder is what it always was: an error naming it
    with pytest.raises(ModelResolutionError, match="first-host"):
        trainer(reference_store, tmp_path / "work-f")._train(
            step_input(1, folder).model_copy(update={"run_id": "x"})
        )


async def test_a_model_the_trainer_host_cannot_resolve_fails_the_stage_for_good(tmp_path):
    acts = TrainerActivities(LocalStore(tmp_path / "store"), tmp_path / "work", device="cpu")
    inp = StageBaseModelInput(run_id="run-b", model=str(tmp_path / "not-here"))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.stage_base_model, inp)
    assert err.value.type == "ModelResolutionError" and err.value.non_retryable
    assert "run-b" in str(err.value) and "not-here" in str(err.value)
