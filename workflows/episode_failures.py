"""Whose failure it is: how the episode workflow classifies what went wrong (Temporal workflow code).

Every failure is classified (EpisodeResult.failure_kind, the rule in grove/episodes.py): the native
program's own errors, a generation refused for the policy's request (prompt too long, empty prompt, token
ids outside the vocabulary, a malformed prompt spec) and an external harness's reported failure are
"policy" (the episode counts in its group's baseline with the run's failure_reward); lost attempts
exhausted, any other generation failure (a broken engine, a lost staging object), an idle timeout, a
harness runner that failed for good, a reported failure that names one of the gateway's own error codes
(INFRASTRUCTURE_CODES: no worker, Temporal or the store unavailable...) or that the harness itself calls
"infrastructure" (`CloseRequest.failure_kind`), and a reward or materialization that could not succeed
are "infrastructure" (excluded from the baseline, counted in the step's metrics).

A generate attempt whose worker vanished (heartbeat, start-to-close or schedule-to-start timeout) or whose
engine died under it is *lost*, not wrong: the workflow discards it and re-admits the call under a new id.
A ledger rule broken by a request fails only that Update or call (`ledger_failure`), never the workflow.

Reads Temporal's exception types only; no workflow calls.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from grove.contracts import CloseRequest
from ledger.errors import LedgerError

# generate activity errors caused by what the policy asked for (activities/engine.py, generate.py):
# the policy's failure. Every other generation failure is the infrastructure's.
POLICY_GENERATION_ERRORS = frozenset(
    {"PromptTooLongError", "EmptyPromptError", "TokenIdOutOfRangeError", "PromptSpecError"}
)

# Failures that say the worker's engine died under the call (activities/engine.py EngineDiedError; the
# worker then exits): the attempt is lost like a crashed worker's, not a wrong answer.
LOST_ATTEMPT_ERRORS = frozenset({"EngineDiedError"})

# The error codes the gateway answers for its own trouble (HTTP 5xx: gateway/http/routes/errors.py; a unit
# test keeps them equal): a harness that gave up on one of them reports grove's failure, not the policy's.
INFRASTRUCTURE_CODES = frozenset(
    {
        "NoWorkerError",
        "TemporalUnavailableError",
        "EpisodeQueryError",
        "TokenizerBusyError",
        "TokenCountUnavailableError",
        "LedgerRestoringError",
        "UnrenderableToolCallError",
        "BodyWorkerLostError",
        "StorageError",
        "StoreUnreachableError",
        "ObjectNotFoundError",
        "DigestMismatchError",
        "InvalidKeyError",
        "CorruptChatRecordError",
        "NoChatTemplateError",
        "UnsupportedTokenizerError",
        "InternalError",
        "BucketNotFoundError",
        "CompletionClaimError",
        "CompletionDigestError",
        "CompletionMissingError",
        "KeyPathConflictError",
        "MissingCredentialsError",
        "S3RequestError",
        "StoreAccessDeniedError",
        "StoreConfigError",
        "SymlinkedKeyError",
        "UpdateOutcomeTimeoutError",
    }
)

# Who closed an episode when its harness did not: a failure they report is not the policy's.
IDLE_TIMEOUT = "idle timeout"
HARNESS_RUNNER = "harness runner"


def ledger_failure(err: LedgerError) -> ApplicationError:
    # ApplicationError fails only this Update / call; any other exception would retry the workflow task
    return ApplicationError(str(err), type=type(err).__name__, non_retryable=True)


def generation_failure_kind(err: ActivityError) -> str:
    """Who failed a call whose generation will not be retried (see POLICY_GENERATION_ERRORS)."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in POLICY_GENERATION_ERRORS:
        return "policy"
    return "infrastructure"  # lost attempts exhausted, a broken engine, a lost staging object


def is_lost_attempt(err: ActivityError) -> bool:
    """A timeout means the worker vanished mid-call (crash, preemption): the attempt is lost, not wrong."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in LOST_ATTEMPT_ERRORS:
        return True
    return isinstance(cause, TimeoutError) and cause.type in (
        TimeoutType.HEARTBEAT,
        TimeoutType.START_TO_CLOSE,
        TimeoutType.SCHEDULE_TO_START,
    )


def close_failure_kind(req: CloseRequest, closed_by: str | None) -> str | None:
    """A harness that reported a failure ran the policy and gave up: the policy's, unless the harness
    says otherwise (`req.failure_kind`) or its failure names the gateway's own trouble
    (INFRASTRUCTURE_CODES: it gave up because grove could not serve it). An idle timeout (the harness
    went silent: crashed, lost, hung) or a failed runner cannot be blamed on the policy either."""
    if req.failure is None:
        return None
    if req.failure_kind is not None:
        return req.failure_kind
    if closed_by in (IDLE_TIMEOUT, HARNESS_RUNNER) or any(c in req.failure for c in INFRASTRUCTURE_CODES):
        return "infrastructure"
    return "policy"


def failure_text(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return f"{cause.type}: {cause.message}"
    return f"{type(cause).__name__ if cause else 'ActivityError'}: {cause or err}"
