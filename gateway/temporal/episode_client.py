"""The gateway's view of episode workflows: the EpisodeWorkflow's queries and Updates, with Temporal's
exceptions turned into the gateway's named errors.

Everything the gateway knows about an episode comes from here (the workflow's start input, its
ledger summary) or from the object store (capture/records.py); the gateway has no state of its own.
Updates are addressed by name, so this module imports no workflow code.

Addressing: by workflow id only, never a run id, so every query and Update reaches the episode's
*current* run and follows its continue-as-new hand-overs. An Update that the workflow refuses with
`HandingOver` (the run is draining before it continues-as-new) is retried with backoff until the next
run takes it (`HANDOVER_PATIENCE`); Updates that Temporal had admitted but the old run never saw are
moved to the new run by Temporal itself. An Update that Temporal's server itself rejects as
`UnprocessedUpdate` (a worker completed the workflow task that carried it without processing it: seen under
heavy load with "unprocessed protocol messages" in the worker's log) was never admitted either, and is retried
the same way: it is an infrastructure hiccup, not an answer about the request.

Every Update carries an id fixed for the request: `open_context/<context>/<record digest>`, `discard/<call>`,
`close/<digest>`, and `call/<call id>/<a nonce of this request>` (a `call` Update lasts until the call's
generation ends). When Temporal's answer to an Update times out (WorkflowUpdateRPCTimeoutOrCancelledError:
the server was slow to answer, the Update perhaps admitted and still running), the gateway asks again with
the same id, which Temporal answers from the same Update: the harness keeps waiting for what it started
(backing off from 50 ms to 1 s, for `OUTCOME_PATIENCE` at most, then 503). The SDK reports a cancelled
request (its client left, Starlette cancelled the response) as the same exception; that is told apart by
its cause and ends the request at once: asking again would be cancelled again at once, for ever.
(The call's nonce keeps another request that gets the same call id - one whose Update failed before the
ledger admitted it - from being answered with that failure by Temporal's deduplication.) A harness that
got a 503 for a call that was alive would re-send its request and be refused (409, the head still
generating) until it gave up. (Across a continue-as-new
hand-over the same id would reach the next run as a new Update, which the ledger refuses as
DuplicateCallError; hand-overs drain running calls first, so only a timeout at that very moment meets it.)

Close: the Update id is the close's digest, so the same close sent twice is one Update (idempotent)
and a different one reaches the workflow, which refuses it (`AlreadyClosed`, HTTP 409). After the
workflow has ended, the close digest in its memo decides the same way.

Delivery: `deliver/<call>` records that a call's response went out whole to a client still connected
(ledger/delivery.py); the workflow refuses it after a close, and the response then does not count.
The `delivery_refusal` query asks, before the last part is sent, whether it would be refused.

Transient answers (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED) of any query, read or Update
are asked again within a bound (gateway/temporal/retry_policy.py). A query refused with `LedgerRestoring` (a
continued-as-new run still loading its ledger's pages: its answer would come from part of the ledger) is asked
again with backoff for `restore_patience` seconds (grove/ledger_restoring.py), then 503
`LedgerRestoringError`: a request is never planned from a partial ledger. Per request the gateway asks only
what the request needs: the episode's spec once per episode (cached: a workflow id's start input never
changes, and `grove.episode_start` refuses to start a second episode under an id), and the `context_view` of
its own agents, never the whole `summary`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TypeVar

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

from gateway.temporal.retry_policy import FIRST_DELAY, MAX_DELAY, TRANSIENT_PATIENCE, transient_retries
from gateway.temporal.worker_wait import WORKER_PATIENCE_S, unserved, when_served
from grove.contracts import (
    CallRequest,
    CallResult,
    CloseRequest,
    DiscardRequest,
    EpisodeProgress,
    EpisodeResult,
    EpisodeSpec,
    close_digest,
)
from grove.ledger_restoring import RESTORE_PATIENCE_S, ask_while_restoring, is_restoring
from grove.receipts import ContextRecord
from ledger.accounting import LedgerSummary, SummaryPage
from ledger.context_view import ContextView, ViewRequest

EPISODE_WORKFLOW = "EpisodeWorkflow"
HANDING_OVER = "HandingOver"  # the workflow's retryable refusal while it continues-as-new
# Temporal's server-side rejection of an Update no worker processed (ApplicationFailure type, source Server)
UNPROCESSED_UPDATE = "UnprocessedUpdate"
RETRIED_REFUSALS = frozenset({HANDING_OVER, UNPROCESSED_UPDATE})  # nothing was admitted: send it again
HANDOVER_PATIENCE = 300.0  # seconds a request waits for a hand-over (draining waits for running calls)
# Seconds an Update whose answers keep timing out is asked again: a `call` Update lasts as long as its
# generation (5 min at most, after queueing behind other calls); past this Temporal is not answering.
OUTCOME_PATIENCE = 1800.0
ALREADY_CLOSED = "AlreadyClosed"
NO_DELIVER_HANDLER = "Update handler for 'deliver' expected but not found"  # the SDK's words, older workers
SPEC_CACHE = 4096  # episodes whose spec a gateway keeps (a few KB each)
# A query answers in milliseconds when a worker holds the episode; one that waits on a worker that just
# died (its sticky queue) is cut here and asked again (gateway/temporal/retry_policy.py), instead of after the
# server's 30 s.
QUERY_TIMEOUT = timedelta(seconds=10)

T = TypeVar("T")
log = logging.getLogger(__name__)


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


class NoWorkerError(TemporalUnavailableError):
    """No grove worker polled the episode workflow's task queue within the gateway's patience
    (gateway/temporal/worker_wait.py)."""


class LedgerRestoringError(TemporalUnavailableError):
    """The episode's run was still loading its ledger's pages (its queries refused with LedgerRestoring)
    after the gateway's patience."""


class UpdateOutcomeTimeoutError(TemporalUnavailableError):
    """Temporal did not answer an Update in time; the Update itself may be admitted and still running."""


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
    except WorkflowQueryFailedError as err:
        if is_restoring(err.message):
            raise LedgerRestoringError(f"{err.message}; retry the request") from None
        raise EpisodeQueryError(f"episode {episode_id!r}: {what} failed: {err}") from None
    except WorkflowQueryRejectedError as err:
        raise EpisodeQueryError(f"episode {episode_id!r}: {what} failed: {err}") from None
    except WorkflowFailureError as err:
        raise EpisodeFailedError(f"episode {episode_id!r} failed: {err.cause or err}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError as err:
        if isinstance(err.__cause__, asyncio.CancelledError):
            # The request itself was cancelled (its client left): the SDK reports that as this same
            # error. It is not Temporal's timeout: asking again would be cancelled again at once, forever.
            raise err.__cause__ from None
        raise UpdateOutcomeTimeoutError(
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

    def __init__(
        self,
        client: Client,
        worker_wait_s: float = WORKER_PATIENCE_S,
        query_timeout: timedelta = QUERY_TIMEOUT,
    ) -> None:
        self.client = client
        self.worker_wait_s = (
            worker_wait_s  # a query waits this long for a worker (gateway/temporal/worker_wait.py)
        )
        self.query_timeout = query_timeout  # one query's wait; past it Temporal answers CANCELLED (retried)
        self.transient_patience = TRANSIENT_PATIENCE  # how long transient answers are asked again
        self.outcome_patience = OUTCOME_PATIENCE  # how long timed-out Update answers are asked again
        self.restore_patience = RESTORE_PATIENCE_S  # how long a query refused during a restore is asked again
        self.outcome_waits = 0  # times an Update's answer timed out and was waited for again
        self.restoring_waits = 0  # query answers `LedgerRestoring` waited out (grove/ledger_restoring.py)
        self.transient_retries = 0  # transient answers asked again (gateway/temporal/retry_policy.py)
        self._specs: OrderedDict[str, EpisodeSpec] = OrderedDict()

    def _handle(self, episode_id: str) -> WorkflowHandle:
        return self.client.get_workflow_handle(episode_id)

    def _retried(self, err: RPCError) -> None:
        self.transient_retries += 1
        log.info("Temporal answered %s (%s); asking again", err.status.name, err.message)

    async def _ask(self, episode_id: str, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A query or read, asked again on transient answers, with Temporal's errors translated."""
        async with temporal_errors(episode_id, what):
            return await transient_retries(call, patience=self.transient_patience, on_retry=self._retried)

    async def spec(self, episode_id: str) -> EpisodeSpec:
        """The episode's EpisodeSpec (its start input); NotExternalEpisodeError for a native harness.
        Read once per episode: the start input of a workflow id never changes."""
        cached = self._specs.get(episode_id)
        if cached is not None:
            self._specs.move_to_end(episode_id)
            return cached
        spec = await self._read_spec(episode_id)
        self._specs[episode_id] = spec
        while len(self._specs) > SPEC_CACHE:
            self._specs.popitem(last=False)
        return spec

    async def _read_spec(self, episode_id: str) -> EpisodeSpec:
        async def first_event():
            async for event in self._handle(episode_id).fetch_history_events(page_size=1):
                return event.workflow_execution_started_event_attributes
            return None

        started = await self._ask(episode_id, "reading the start event", first_event)
        if started is None:
            raise EpisodeNotFoundError(f"workflow {episode_id!r} has no history; it was never started")
        kind = started.workflow_type.name
        if kind != EPISODE_WORKFLOW:
            raise NotExternalEpisodeError(f"workflow {episode_id!r} is a {kind}, not an {EPISODE_WORKFLOW}")
        [spec] = await self.client.data_converter.decode(started.input.payloads, [EpisodeSpec])
        if spec.harness.kind == "native":  # external: hand-run; opencode, python: launched by the runner
            raise NotExternalEpisodeError(
                f"episode {episode_id!r} is driven by its {spec.harness.kind} harness "
                f"({spec.harness.program!r}); the gateway serves only episodes of external harnesses "
                "(harness kind 'external', 'opencode' or 'python')"
            )
        return spec

    async def _through_handover(self, episode_id: str, what: str, update: Callable[[], Awaitable[T]]) -> T:
        """Run `update` (an Update with an id fixed for the request), retrying it while it is refused
        without being admitted (RETRIED_REFUSALS: the episode handing over, or Temporal's
        UnprocessedUpdate), for HANDOVER_PATIENCE at most, and asking again, with the same backoff, while
        Temporal's answers time out (the same id: the same Update, perhaps still running), for
        `outcome_patience` at most. A cancelled request (its client left) stops at once: cancellation is
        never taken for a timeout (temporal_errors)."""
        start = time.monotonic()
        delay = FIRST_DELAY
        while True:
            try:
                async with temporal_errors(episode_id, what):
                    return await transient_retries(
                        update, patience=self.transient_patience, on_retry=self._retried
                    )
            except UpdateOutcomeTimeoutError:
                self.outcome_waits += 1
                if time.monotonic() - start > self.outcome_patience:
                    raise UpdateOutcomeTimeoutError(
                        f"episode {episode_id!r}: {what}: Temporal's answers kept timing out for "
                        f"{self.outcome_patience:g} s; retry the request"
                    ) from None
                log.info(
                    "episode %r: %s: Temporal's answer timed out; asking the same Update", episode_id, what
                )
            except EpisodeUpdateRejectedError as err:
                if err.error_type not in RETRIED_REFUSALS:
                    raise
                if time.monotonic() - start > HANDOVER_PATIENCE:
                    raise TemporalUnavailableError(
                        f"episode {episode_id!r}: {what}: still refused ({err.error_type}: the episode "
                        f"handing over to its next workflow run, or no worker processing the Update) after "
                        f"{HANDOVER_PATIENCE:g} s; retry the request"
                    ) from None
            await asyncio.sleep(delay)  # a cancellation lands here too
            delay = min(delay * 2, MAX_DELAY)

    async def _query(self, episode_id: str, name: str, *args: object, result_type: type[T]) -> T:
        """A query of the episode: transient answers asked again while a worker polls its queue
        (gateway/temporal/retry_policy.py); while none does, it waits for one
        (gateway/temporal/worker_wait.py); while the episode restores its ledger, it waits for that
        (grove/ledger_restoring.py)."""
        what = f"the {name} query"
        handle = self._handle(episode_id)

        async def no_worker() -> bool:
            return await unserved(self.client, episode_id) is not None

        def once() -> Awaitable[T]:
            return handle.query(name, *args, result_type=result_type, rpc_timeout=self.query_timeout)

        async def ask() -> T:
            async with temporal_errors(episode_id, what):
                return await transient_retries(
                    once, patience=self.transient_patience, on_retry=self._retried, stop_if=no_worker
                )

        def served() -> Awaitable[T]:
            unavailable, patience = TemporalUnavailableError, self.worker_wait_s
            return when_served(self.client, episode_id, what, ask, unavailable, NoWorkerError, patience)

        return await ask_while_restoring(
            served,
            lambda err: isinstance(err, LedgerRestoringError),
            patience=self.restore_patience,
            on_wait=self._restoring,
        )

    def _restoring(self, err: BaseException) -> None:
        self.restoring_waits += 1
        log.info("%s; asking again", err)

    async def progress(self, episode_id: str) -> EpisodeProgress:
        return await self._query(episode_id, "progress", result_type=EpisodeProgress)

    async def summary(self, episode_id: str, page: SummaryPage | None = None) -> LedgerSummary:
        """One page of the ledger's summary (the first page without `page`; for people and tools, never
        per request: a request reads its `context_view`)."""
        return await self._query(episode_id, "summary", page or SummaryPage(), result_type=LedgerSummary)

    async def context_view(self, episode_id: str, req: ViewRequest) -> ContextView:
        """The contexts of the agents one request may involve (ledger/context_view.py)."""
        return await self._query(episode_id, "context_view", req, result_type=ContextView)

    async def call_states(self, episode_id: str, call_ids: list[str]) -> dict[str, str]:
        """The ledger state of each call id (absent: never admitted)."""
        return await self._query(episode_id, "call_states", call_ids, result_type=dict)

    async def open_context(self, episode_id: str, record: ContextRecord) -> ContextRecord:
        # The update id makes concurrent openings of the same record one Update (Temporal dedups by id).
        # It names the whole record, not only the context id: an Update accepted while the ledger was
        # restoring and then refused by it (a spawn by a settled call) would otherwise answer a later,
        # different opening of the same context id with that refusal.
        digest = hashlib.sha256(record.model_dump_json().encode()).hexdigest()[:16]
        return await self._through_handover(
            episode_id,
            f"open_context {record.context_id}",
            lambda: self._handle(episode_id).execute_update(
                "open_context",
                record,
                id=f"open_context/{record.context_id}/{digest}",
                result_type=ContextRecord,
            ),
        )

    async def call(self, episode_id: str, request: CallRequest) -> CallResult:
        update_id = f"call/{request.call_id}/{uuid.uuid4().hex[:12]}"  # one per request, kept when re-asked
        return await self._through_handover(
            episode_id,
            f"call {request.call_id}",
            lambda: self._handle(episode_id).execute_update(
                "call", request, id=update_id, result_type=CallResult
            ),
        )

    async def discard(self, episode_id: str, call_id: str, reason: str) -> None:
        req = DiscardRequest(call_id=call_id, reason=reason)
        await self._through_handover(
            episode_id,
            f"discard {call_id}",
            lambda: self._handle(episode_id).execute_update("discard", req, id=f"discard/{call_id}"),
        )

    async def delivery_refusal(self, episode_id: str, call_id: str) -> str:
        """What the ledger would refuse the call's `deliver` with now (`ErrorType: message`), "" when it
        would take it. An episode worker without this query (older) takes every delivery it can."""
        try:
            return await self._query(episode_id, "delivery_refusal", call_id, result_type=str)
        except EpisodeQueryError as err:
            log.warning("episode %r: no delivery_refusal query (an older worker): %s", episode_id, err)
            return ""

    async def deliver(self, episode_id: str, call_id: str) -> None:
        """The call's response went out whole to a connected client: recorded in the ledger, or refused
        (EpisodeUpdateRejectedError: `Closing` after a close, `UndeliverableCallError`): then it does not
        count. A call the ledger counts as delivered already is accepted again, after a close too. An
        episode worker of before delivery in the ledger (a rolling deploy) has no `deliver` handler; its
        calls never await delivery (they count on completion): nothing to record."""
        try:
            await self._through_handover(
                episode_id,
                f"deliver {call_id}",
                lambda: self._handle(episode_id).execute_update("deliver", call_id, id=f"deliver/{call_id}"),
            )
        except EpisodeUpdateRejectedError as err:
            if err.error_type != "RuntimeError" or NO_DELIVER_HANDLER not in str(err):
                raise
            log.warning("episode %r: its worker has no deliver Update (an older worker): %s", episode_id, err)

    async def close(self, episode_id: str, request: CloseRequest) -> None:
        """Close (final): the same close again is a no-op, another one is refused (AlreadyClosed)."""
        digest = close_digest(request)
        try:
            await self._through_handover(
                episode_id,
                "close",
                lambda: self._handle(episode_id).execute_update("close", request, id=f"close/{digest}"),
            )
        except EpisodeNotFoundError:
            await self._closed_before(episode_id, digest)

    async def _closed_before(self, episode_id: str, digest: str) -> None:
        """The workflow has ended: fine if it was closed by this very close, else AlreadyClosed."""
        desc = await self._ask(episode_id, "close", self._handle(episode_id).describe)
        async with temporal_errors(episode_id, "close"):
            memo = await desc.memo()
        closed = memo.get("close") or {}
        if closed.get("sha256") == digest:
            return
        raise EpisodeUpdateRejectedError(
            f"episode {episode_id!r} has ended ({desc.status.name if desc.status else 'unknown'}; closed by "
            f"{closed.get('by', 'nobody')}, failure={closed.get('failure')!r}); a close is final: only the "
            "same close may be sent again. Start a new episode for a new attempt",
            error_type=ALREADY_CLOSED,
        )

    async def result(self, episode_id: str) -> EpisodeResult:
        handle = self.client.get_workflow_handle(episode_id, result_type=EpisodeResult)
        return await self._ask(episode_id, "waiting for the result", handle.result)
