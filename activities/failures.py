"""How activities report a storage outage to Temporal: short, retryable, named by the error class."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from storage.base import StorageError


def retryable_storage_failure(what: str, err: StorageError) -> ApplicationError:
    """`err` as a retryable ApplicationError whose type is its class name (StoreUnreachableError, ...).

    Raise it `from None`: with the chained urllib3 / minio tracebacks the failure is larger than
    Temporal keeps for a pending activity, and the UI showed "Failure exceeds size limit." instead of
    what the activity waits for (seen with the S3 server stopped mid-materialize)."""
    return ApplicationError(f"{what}: {type(err).__name__}: {err}", type=type(err).__name__)
