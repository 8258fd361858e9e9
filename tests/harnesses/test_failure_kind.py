"""Who failed an episode: the classification EpisodeWorkflow puts in its result.

Pure: the errors are built the way the Temporal SDK hands them to workflow code (an ActivityError whose
cause is the activity's ApplicationError or a timeout), then classified by the workflow's own functions.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from harnesses.native import GENERATION_FAILED, NativeHarnessError, failure_kind, failure_outcome
from workflows.episode_failures import generation_failure_kind


def activity_error(cause: BaseException) -> ActivityError:
    err = ActivityError("activity failed", scheduled_event_id=1, started_event_id=2, identity="w",
                        activity_type="generate", activity_id="1", retry_state=None)  # fmt: skip
    err.__cause__ = cause
    return err


def test_generation_refused_for_the_policys_request_is_the_policys():
    for name in ("PromptTooLongError", "EmptyPromptError", "TokenIdOutOfRangeError", "PromptSpecError"):
        assert generation_failure_kind(activity_error(ApplicationError("x", type=name))) == "policy"


def test_lost_attempts_and_engine_faults_are_the_infrastructures():
    timeout = TimeoutError("heartbeat", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[])
    assert generation_failure_kind(activity_error(timeout)) == "infrastructure"
    for name in ("EngineBrokenError", "ParentNotStagedError", "GenerationAbortedError"):
        assert generation_failure_kind(activity_error(ApplicationError("x", type=name))) == "infrastructure"


def test_native_program_errors_and_tagged_generation_failures():
    assert failure_kind(NativeHarnessError("spawn before reply")) == "policy"
    assert failure_kind(ApplicationError("ledger rule", type="StaleContinuationError")) == "policy"
    assert failure_kind(ApplicationError("c", "infrastructure", type=GENERATION_FAILED)) == "infrastructure"
    assert failure_kind(ApplicationError("c", "policy", type=GENERATION_FAILED)) == "policy"
    out = failure_outcome(NativeHarnessError("spawn before reply"))
    assert (out.failure, out.failure_kind) == ("NativeHarnessError: spawn before reply", "policy")
