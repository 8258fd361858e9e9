"""A run's `learner.kl_coef` through the train_step activity's own code (`TrainerActivities._train`): the
frozen reference is the run's start model, at the first step and after a resume from a checkpoint.

The activity builds its learner with a reference whenever kl_coef > 0 (without one the step fails with
ReferenceModelError). The reference being the start model (not the step being resumed from) shows in
the KL itself: zero while the policy is the start model, positive once it has moved; a reference taken
from the resumed checkpoint would read zero again at step 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.training import TrainerActivities
from grove.contracts import TrainStepInput
from grove.learner_config import LearnerConfig
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.learner.test_reference import controlled_batch, rows_of
from trainer.rows import rows_to_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

ROWS_KEY = "rows/batch.parquet"
CFG = LearnerConfig(lr=1e-3, kl_coef=0.1)


def step_input(step: int, model: Path) -> TrainStepInput:
    return TrainStepInput(run_id="kl", step=step, model=str(model), row_keys=[ROWS_KEY], learner=CFG)


def activities(store: LocalStore, work: Path) -> TrainerActivities:
    work.mkdir()  # train_step makes it before its first step; _train is called here directly
    return TrainerActivities(store, work, device="cpu")


def test_a_run_with_a_kl_penalty_trains_against_its_start_model_across_a_resume(learner_model_dir, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put(ROWS_KEY, rows_to_parquet(rows_of(controlled_batch(512))))

    first = activities(store, tmp_path / "work-1")._train(step_input(1, learner_model_dir))
    # a fresh activity instance: nothing in memory, step 2 resumes from step 1's checkpoint
    second = activities(store, tmp_path / "work-2")._train(step_input(2, learner_model_dir))

    assert first["kl"] == 0.0  # the policy is still the start model
    assert second["kl"] > 0.0, second  # moved by step 1, measured against the start model
    assert first["loss_tokens"] == second["loss_tokens"] > 0
