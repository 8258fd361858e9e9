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


def _gateway_server_error_codes() -> set[str]:
    """The `code` of every error the gateway answers with HTTP 5xx (its own trouble), subclasses too."""
    import storage.local  # noqa: F401  (their StorageError subclasses)
    import storage.s3  # noqa: F401
    from gateway.http.routes.errors import STATUS

    def names(cls: type) -> set[str]:
        return {cls.__name__}.union(*(names(sub) for sub in cls.__subclasses__()))

    return {"InternalError"}.union(*(names(cls) for cls, (status, _) in STATUS.items() if status >= 500))


def test_a_reported_failure_naming_the_gateways_trouble_is_the_infrastructures():
    from grove.contracts import CloseRequest
    from workflows.episode_failures import HARNESS_RUNNER, INFRASTRUCTURE_CODES, close_failure_kind

    assert _gateway_server_error_codes() == INFRASTRUCTURE_CODES
    no_worker = (
        "openai.InternalServerError: Error code: 503 - {'error': {'message': \"episode 'e': no worker polls "
        "the episodes queue\", 'type': 'server_error', 'param': None, 'code': 'NoWorkerError'}}"
    )
    assert close_failure_kind(CloseRequest(failure=no_worker), "harness") == "infrastructure"
    assert close_failure_kind(CloseRequest(failure="the answer was not found"), "harness") == "policy"
    said = CloseRequest(failure="my tool server is down", failure_kind="infrastructure")
    assert close_failure_kind(said, "harness") == "infrastructure"  # the harness says whose it is
    assert close_failure_kind(CloseRequest(failure="x"), HARNESS_RUNNER) == "infrastructure"
    assert close_failure_kind(CloseRequest(), "harness") is None
