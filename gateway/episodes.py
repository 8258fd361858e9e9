"""The gateway's view of episode workflows: the EpisodeWorkflow's queries and Updates, with Temporal's
exceptions turned into the gateway's named errors.

Everything the gateway knows about an episode comes from here (the workflow's start input, its
ledger summary) or from the object store (gateway/records.py); the gateway has no state of its own.
Updates are addressed by name, so this module imports no workflow code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from grove.contracts import CallRequest, CallResult, CloseRequest, DiscardRequest, EpisodeResult, EpisodeSpec
from grove.receipts import ContextRecord
from workflows.accounting import LedgerSummary

EPISODE_WORKFLOW = "EpisodeWorkflow"


class EpisodeError(Exception):
    """Base of the errors the gateway gets from an episode workflow."""


class EpisodeNotFoundError(EpisodeError):
    """No workflow with this id, or it has already finished."""


class NotExternalEpisodeError(EpisodeError):
    """The workflow is not an EpisodeWorkflow driven by an external harness."""


class EpisodeUpdateRejectedError(EpisodeError):
    """The workflow refused an Update; `error_type` names the ledger's error (e.g. StaleContinuationError)."""

    def __init__(self, message: str, *, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class EpisodeQueryError(EpisodeError):
    """A query the workflow failed to answer."""


class EpisodeFailedError(EpisodeError):
    """The episode workflow itself failed (not a stated outcome: a bug or a terminated workflow)."""


class TemporalUnavailableError(EpisodeError):
    """Temporal did not answer (server down, RPC timeout)."""


@asynccontextmanager
async def temporal_errors(episode_id: str, what: str) -> AsyncIterator[None]:
    """Translate Temporal's exceptions for `what` on `episode_id` into EpisodeError subclasses."""
    try:
        yield
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError):
            raise EpisodeUpdateRejectedError(
                cause.message, error_type=cause.type or "ApplicationError"
            ) from None
        raise EpisodeUpdateRejectedError(f"{what}: {cause}", error_type=type(cause).__name__) from None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:
        raise EpisodeQueryError(f"episode {episode_id!r}: {what} failed: {err}") from None
    except WorkflowFailureError as err:
        raise EpisodeFailedError(f"episode {episode_id!r} failed: {err.cause or err}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise TemporalUnavailableError(
            f"episode {episode_id!r}: {what}: Temporal did not answer in time; retry the request"
        ) from None
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise EpisodeNotFoundError(
                f"episode {episode_id!r} is not running ({what}: {err.message}); start the episode workflow "
                "first, or check the episode id"
            ) from None
        raise TemporalUnavailableError(
            f"episode {episode_id!r}: {what}: Temporal answered {err.status.name}: {err.message}"
        ) from None


class Episodes:
    """Queries and Updates of episode workflows through one Temporal client (pydantic converter)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _handle(self, episode_id: str) -> WorkflowHandle:
        return self.client.get_workflow_handle(episode_id)

    async def spec(self, episode_id: str) -> EpisodeSpec:
        """The episode's EpisodeSpec (its start input); NotExternalEpisodeError unless harness external."""
        started = None
        async with temporal_errors(episode_id, "reading the start event"):
            async for event in self._handle(episode_id).fetch_history_events(page_size=1):
                started = event.workflow_execution_started_event_attributes
                break
        if started is None:
            raise EpisodeNotFoundError(f"workflow {episode_id!r} has no history; it was never started")
        kind = started.workflow_type.name
        if kind != EPISODE_WORKFLOW:
            raise NotExternalEpisodeError(f"workflow {episode_id!r} is a {kind}, not an {EPISODE_WORKFLOW}")
        [spec] = await self.client.data_converter.decode(started.input.payloads, [EpisodeSpec])
        if spec.harness.kind != "external":
            raise NotExternalEpisodeError(
                f"episode {episode_id!r} is driven by its {spec.harness.kind} harness "
                f"({spec.harness.program!r}); the gateway serves only episodes with harness kind 'external'"
            )
        return spec

    async def summary(self, episode_id: str) -> LedgerSummary:
        async with temporal_errors(episode_id, "the summary query"):
            return await self._handle(episode_id).query("summary", result_type=LedgerSummary)

    async def open_context(self, episode_id: str, record: ContextRecord) -> ContextRecord:
        # The update id makes concurrent openings of the same context one Update (Temporal dedups by id).
        async with temporal_errors(episode_id, f"open_context {record.context_id}"):
            return await self._handle(episode_id).execute_update(
                "open_context", record, id=f"open_context/{record.context_id}", result_type=ContextRecord
            )

    async def call(self, episode_id: str, request: CallRequest) -> CallResult:
        async with temporal_errors(episode_id, f"call {request.call_id}"):
            return await self._handle(episode_id).execute_update("call", request, result_type=CallResult)

    async def discard(self, episode_id: str, call_id: str, reason: str) -> None:
        async with temporal_errors(episode_id, f"discard {call_id}"):
            await self._handle(episode_id).execute_update(
                "discard", DiscardRequest(call_id=call_id, reason=reason), id=f"discard/{call_id}"
            )

    async def close(self, episode_id: str, request: CloseRequest) -> None:
        async with temporal_errors(episode_id, "close"):
            await self._handle(episode_id).execute_update("close", request, id="close")

    async def result(self, episode_id: str) -> EpisodeResult:
        async with temporal_errors(episode_id, "waiting for the result"):
            return await self.client.get_workflow_handle(episode_id, result_type=EpisodeResult).result()
