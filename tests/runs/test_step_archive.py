"""Step records a run's state no longer carries: written once per step, read back in order (no services)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.episode_io import EpisodeIO
from cli.runs import step_history
from grove.contracts import ArchiveStepsInput, StepRecord
from grove.store_layout import step_record_key
from storage.local import LocalStore


def _record(step: int, reward: float = 0.5) -> StepRecord:
    return StepRecord(step=step, mean_reward=reward, episodes=4, failed_episodes=0, policy_version=step)


def test_archived_records_join_the_carried_ones_in_step_order(tmp_path):
    store = LocalStore(tmp_path)
    io = EpisodeIO(store)
    io.archive_step_records(ArchiveStepsInput(run_id="r/1", records=[_record(1), _record(2)]))
    io.archive_step_records(ArchiveStepsInput(run_id="r/1", records=[_record(2), _record(3)]))  # a retry
    assert store.stat(step_record_key("r/1", 3)) is not None
    carried = [_record(4), _record(5)]
    assert step_history(store, "r/1", carried, history_from=4) == [_record(s) for s in range(1, 6)]


def test_a_different_record_for_an_archived_step_is_refused_not_overwritten(tmp_path):
    io = EpisodeIO(LocalStore(tmp_path))
    io.archive_step_records(ArchiveStepsInput(run_id="r", records=[_record(1)]))
    with pytest.raises(ApplicationError) as refused:
        io.archive_step_records(ArchiveStepsInput(run_id="r", records=[_record(1, reward=0.9)]))
    assert refused.value.type == "DigestMismatchError" and refused.value.non_retryable
    assert "step-000001" in str(refused.value)
