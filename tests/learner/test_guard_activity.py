"""A gradient-guard refusal through the train_step activity (activities/training.py): a named,
non-retryable failure of that step carrying its evidence (Temporal would otherwise retry the same
deterministic refusal until its attempts ran out), the evidence also in the store; with
`guard_refusal="skip"` the step completes without an update and reports it in its metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.training import TrainerActivities
from grove.contracts import TrainStepInput
from grove.learner_config import LearnerConfig
from grove.store_layout import guard_refusal_key
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.learner.test_grad_guard import poison_bucket_attention
from tests.learner.test_reference import controlled_batch, rows_of
from trainer.grad_guard import IMPLAUSIBLE_FACTOR
from trainer.rows import rows_to_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

ROWS_KEY = "rows/batch.parquet"


def run_step(store: LocalStore, work: Path, model: Path, config: LearnerConfig):
    inp = TrainStepInput(run_id="guard", step=1, model=str(model), row_keys=[ROWS_KEY], learner=config)
    acts = TrainerActivities(store, work, device="cpu")
    return asyncio.run(ActivityEnvironment().run(acts.train_step, inp))


def test_a_refused_step_fails_non_retryably_with_its_evidence(learner_model_dir, tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    store.put(ROWS_KEY, rows_to_parquet(rows_of(controlled_batch(512))))
    poison_bucket_attention(monkeypatch, 1e4)
    with pytest.raises(ApplicationError) as failed:
        run_step(store, tmp_path / "work", learner_model_dir, LearnerConfig(layout="tree"))
    err = failed.value
    assert err.non_retryable and err.type == "ImplausibleGradientError"
    (evidence,) = err.details
    assert evidence["pass"] == 1 and evidence["rows"] and evidence["ratio"] > IMPLAUSIBLE_FACTOR
    stored = json.loads(store.get(guard_refusal_key("guard", 1)))
    assert stored["guard_refused"] == 1 and stored["outcome"] == "fail"
    assert stored["grad_norm"] == evidence["grad_norm"] and stored["rows"] == evidence["rows"]


def test_skip_completes_the_step_without_an_update(learner_model_dir, tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    store.put(ROWS_KEY, rows_to_parquet(rows_of(controlled_batch(512))))
    poison_bucket_attention(monkeypatch, 1e4)
    result = run_step(
        store, tmp_path / "work", learner_model_dir, LearnerConfig(layout="tree", guard_refusal="skip")
    )
    assert result.metrics["guard_refused"] == 1.0 and result.metrics["skipped"] == 1.0
    assert result.metrics["grad_norm"] == 0.0
    assert json.loads(store.get(guard_refusal_key("guard", 1)))["outcome"] == "skip"


def test_a_rank_refusal_is_raised_as_the_error_it_was(tmp_path):
    """The supervisor of ranks > 1 (activities/train_ranks.py): a rank that exited REFUSED_EXIT after
    writing its refusal makes the attempt raise that refusal (non-retryable in train_step), not the
    retryable RankLostError; any other exit is not a refusal."""
    from activities.train_ranks import REFUSED_EXIT, _raise_refusal, refusal_file
    from trainer.grad_guard import NonFiniteError

    evidence = {"kind": "non-finite", "step": 3, "pass": 2, "rows": ["r1"], "grad_norm": "nan"}
    record = {"type": "NonFiniteError", "message": "step 3: micro-batch 2 of 4 ...", "evidence": evidence}
    refusal_file(tmp_path, 1).write_text(json.dumps(record))
    _raise_refusal(tmp_path, 1, 1)  # a crash, not a refusal: the caller raises RankLostError
    _raise_refusal(tmp_path, 0, REFUSED_EXIT)  # no file from rank 0
    with pytest.raises(NonFiniteError, match="rank 1: step 3") as raised:
        _raise_refusal(tmp_path, 1, REFUSED_EXIT)
    assert raised.value.evidence == evidence
