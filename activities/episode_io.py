"""Episode activities on the `io` queue: reward, row materialization, staging cleanup, ledger pages,
claim-checked completions (the native harness's).

Thin shells: load from the object store, call the pure core (the task family's scorer,
trainer.forest.reconstruct), store. Materialize also writes the episode's call archive beside its rows
(capture/call_archive.py), for viewers. Every write is idempotent (deterministic key, put_if_absent),
so a retried activity finds its own bytes and verifies them.

Failure classes (the workflow's retry policy retries everything else for as long as an outage lasts):
input that can never succeed — a receipt that does not match its tokens, a corrupt staged object,
a missing staged object, an invalid key — is raised as a non-retryable ApplicationError whose type
names the error class. A storage error (unwritable folder, unreachable S3, a full disk) is retried;
each attempt heartbeats its phase and attempt number, so the UI shows what it is waiting for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress

import numpy as np
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.episode_map import encode_contexts, ledger_contexts, record_contexts
from activities.failures import retryable_storage_failure
from capture.call_archive import save_archive
from capture.claims import load_completion
from capture.records import load_record
from chat.message_text import text_of
from gateway.pipeline.identity import AUX_SEPARATOR
from gateway.pipeline.identity import DEFAULT_AGENT as ROOT_AGENT
from grove.contracts import (
    ArchiveStepsInput,
    CleanStagingInput,
    CleanStagingResult,
    Completion,
    HarnessOutcome,
    LoadCompletionInput,
    MaterializeInput,
    MaterializeResult,
    RewardInput,
    RewardResult,
)
from grove.gates import Gates
from grove.receipts import CallReceipt, ContextOrigin, ContextRecord
from grove.staging_format import CallTokens, StagedObjectError, decode_call_tokens
from grove.store_layout import contexts_key, staging_prefix, step_record_key
from harnesses.programs import family
from ledger.handover import LedgerIndex, LedgerPage, join_pages, pack_page, unpack_page
from ledger.ledger import Ledger
from storage.base import (
    DigestMismatchError,
    InvalidKeyError,
    ObjectNotFoundError,
    ObjectStore,
    StorageError,
)
from trainer.forest import MEMBER_STATES, EpisodeRef, ForestError, ReconstructionOptions, reconstruct
from trainer.rows import Row, rows_to_parquet
from workflows.step_metrics import call_stats

# Retrying cannot fix these: the data is wrong or gone (a storage outage raises other errors).
BAD_INPUT_ERRORS: tuple[type[Exception], ...] = (
    ForestError,
    StagedObjectError,
    ObjectNotFoundError,
    InvalidKeyError,
    DigestMismatchError,
    KeyError,
    ValueError,
)


@contextmanager
def io_attempt(phase: str, **details: object) -> Iterator[None]:
    """Heartbeat (phase, attempt) for the UI; bad input becomes a non-retryable, named failure."""
    if activity.in_activity():
        activity.heartbeat({"phase": phase, "attempt": activity.info().attempt, **details})
    try:
        yield
    except BAD_INPUT_ERRORS as err:
        raise ApplicationError(
            f"{phase}: {type(err).__name__}: {err}", type=type(err).__name__, non_retryable=True
        ) from err
    except StorageError as err:
        raise retryable_storage_failure(phase, err) from None


def placeholder_row(inp: MaterializeInput) -> Row:
    """A failed episode's single row: no loss, valid=False, so its group stays complete."""
    return Row(
        row_id=f"{inp.episode_id}#placeholder",
        episode_id=inp.episode_id,
        group_id=inp.group_id,
        input_ids=np.zeros(1, dtype=np.int32),
        loss_mask=np.zeros(1, dtype=np.bool_),
        behavior_logprobs=np.zeros(1, dtype=np.float32),
        spans=(),
        reward=inp.reward,
        valid=False,
    )


def parent_agent(records: Iterable[ContextRecord]) -> str:
    """The agent `parent_only` training trains, from the episode's contexts in opening order: `parent`
    (the gateway's default root agent) where the episode has it, else its first root agent that is no
    auxiliary agent (a harness that names its root itself, e.g. an Agents SDK program's starting agent
    under its own name)."""
    roots: list[str] = []
    for record in records:
        if record.agent == ROOT_AGENT:
            return ROOT_AGENT
        if record.origin == ContextOrigin.ROOT and AUX_SEPARATOR not in record.agent:
            roots.append(record.agent)
    return roots[0] if roots else ROOT_AGENT


class EpisodeIO:
    """Activities that need only the object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name="score_episode")
    def score_episode(self, inp: RewardInput) -> RewardResult:
        with io_attempt("score"):
            _, scorer = family(inp.task.family)
            return scorer(inp.task, self._with_ledger_outputs(inp))

    def _with_ledger_outputs(self, inp: RewardInput) -> HarnessOutcome:
        """The outcome, with each agent of `output_calls` answering the content of its call's response
        (the chat record the gateway wrote before delivering it); agents without a record are left out."""
        if not inp.output_calls or inp.episode_id is None:
            return inp.outcome
        outputs = dict(inp.outcome.outputs)
        for agent, call_id in inp.output_calls.items():
            record = load_record(self.store, inp.episode_id, call_id)
            if record is not None:
                outputs[agent] = [text_of(record.response.get("content"))]
        return inp.outcome.model_copy(update={"outputs": outputs})

    def _tokens(self, receipts: list[CallReceipt]) -> dict[str, CallTokens]:
        return {
            r.call_id: decode_call_tokens(self.store.get(r.staging_key), key=r.staging_key)
            for r in receipts
            if r.state in MEMBER_STATES and r.staging_key is not None
        }

    def _page_keys(self, inp: MaterializeInput) -> list[str]:
        """Every page of the episode in writing order: the index chain's (first run first), then the
        last run's own."""
        runs: list[list[str]] = [inp.ledger_pages]
        key = inp.ledger_index
        while key is not None:
            index = LedgerIndex.model_validate_json(self.store.get(key))
            runs.append(index.pages)
            key = index.previous
        return [k for pages in reversed(runs) for k in pages]

    def _joined(self, inp: MaterializeInput) -> Ledger:
        """The episode's whole ledger from its snapshot pages, closed as the workflow closed it."""
        pages = [LedgerPage.model_validate_json(self.store.get(key)) for key in self._page_keys(inp)]
        ledger = join_pages(inp.episode_id, inp.group_id, pages)  # later pages override earlier ones
        if inp.close_reason is not None:  # pages of the ledger before its close: close it as the workflow did
            ledger.close(cancel_outstanding=True, reason=inp.close_reason)
        return ledger

    def _placeholder_ledger(self, inp: MaterializeInput) -> Ledger | None:
        """A failed episode's pages, for its accounting only: None when they cannot be read (bad input
        is what may have failed it); a storage error is retried like any other."""
        with io_attempt("materialize: ledger pages of a placeholder", rows_key=inp.rows_key):
            try:
                return self._joined(inp)
            except BAD_INPUT_ERRORS:
                return None

    @staticmethod
    def _numbers(ledger: Ledger | None) -> dict:
        """What the episode's result reports of every call (the workflow may hold only the live ones)."""
        if ledger is None:
            return {}
        accounting = ledger.accounting()
        calls = ledger.calls.values()
        return {
            "counts": {state.value: len(ids) for state, ids in accounting.by_state.items() if ids},
            "call_stats": call_stats(calls, (c.record for c in ledger.contexts.values())),
            "policy_versions": sorted({c.policy_version for c in calls if c.policy_version is not None}),
        }

    @activity.defn(name="materialize_episode")
    def materialize_episode(self, inp: MaterializeInput) -> MaterializeResult:
        ledger = None
        with io_attempt("materialize", rows_key=inp.rows_key):
            if inp.valid:
                ledger = self._joined(inp) if inp.ledger_pages or inp.ledger_index else None
                receipts = ledger.receipts() if ledger is not None else inp.receipts
                records = [c.record for c in ledger.contexts.values()] if ledger is not None else inp.contexts
                tokens = self._tokens(receipts)
                rec = reconstruct(
                    EpisodeRef(episode_id=inp.episode_id, group_id=inp.group_id),
                    receipts,
                    tokens,
                    ReconstructionOptions(
                        train_agents=inp.train_agents,
                        parent_agent=parent_agent(records),
                        train_auxiliary=inp.train_auxiliary,
                    ),
                    reward=inp.reward,
                )
                rows, eligible = rec.rows, rec.accounting.eligible_tokens
                summaries = {
                    "summary_calls_trained": len(rec.accounting.summary_calls_trained),
                    "summary_tokens_trained": rec.accounting.summary_tokens_trained,
                }
            else:
                rows, eligible, summaries, tokens = [placeholder_row(inp)], 0, {}, {}
            # A storage error (PermissionError, StoreUnreachableError) is an outage: it is retried.
            self.store.put_if_absent(inp.rows_key, rows_to_parquet(rows))
        if not inp.valid and (inp.ledger_pages or inp.ledger_index):
            ledger = self._placeholder_ledger(inp)
        with io_attempt("materialize: the episode's contexts", rows_key=inp.rows_key):
            contexts = (
                ledger_contexts(ledger) if ledger is not None else record_contexts(inp.contexts, inp.receipts)
            )
            self.store.put_if_absent(contexts_key(inp.episode_id), encode_contexts(contexts))
        self._archive(inp, ledger, tokens)
        return MaterializeResult(
            rows_key=inp.rows_key, num_rows=len(rows), eligible_tokens=eligible, placeholder=not inp.valid,
            **summaries, **self._numbers(ledger),
        )  # fmt: skip

    def _archive(self, inp: MaterializeInput, ledger: Ledger | None, tokens: dict[str, CallTokens]) -> None:
        """The call archive beside the rows (capture/call_archive.py), for viewers. A retry that finds a
        different archive (a staged object lost in between) keeps the first: nothing trains from it."""
        if ledger is not None:
            contexts, receipts = [c.record for c in ledger.contexts.values()], ledger.receipts()
        else:
            contexts, receipts = inp.contexts, inp.receipts
        with io_attempt("materialize: call archive", rows_key=inp.rows_key), suppress(DigestMismatchError):
            save_archive(self.store, inp.episode_id, inp.group_id, contexts, receipts, tokens)

    @activity.defn(name="clean_staging")
    def clean_staging(self, inp: CleanStagingInput) -> CleanStagingResult:
        if activity.in_activity():
            activity.heartbeat({"phase": "clean staging", "attempt": activity.info().attempt})
        prefixes = ([] if inp.keep else [staging_prefix(inp.episode_id)]) + inp.extra_prefixes
        deleted = 0
        try:
            for prefix in prefixes:
                for key in self.store.list(prefix):
                    self.store.delete(key)
                    deleted += 1
        except StorageError as err:
            raise retryable_storage_failure("clean staging", err) from None
        return CleanStagingResult(deleted=deleted)

    @activity.defn(name="archive_step_records")
    def archive_step_records(self, inp: ArchiveStepsInput) -> None:
        """Step records a run's workflow state stops carrying, one object per step (idempotent: a retry
        or a replayed run finds and verifies its own bytes)."""
        for record in inp.records:
            key = step_record_key(inp.run_id, record.step)
            with io_attempt("archive step record", key=key):
                self.store.put_if_absent(key, record.model_dump_json().encode())

    @activity.defn(name="store_ledger_page")
    def store_ledger_page(self, key: str, packed: bytes) -> None:
        """Write one snapshot page, packed by the workflow (ledger/handover.py pack_page), as plain
        JSON (idempotent: a retry finds and verifies its own bytes)."""
        with io_attempt("store ledger page", key=key):
            self.store.put_if_absent(key, unpack_page(packed).model_dump_json().encode())

    @activity.defn(name="store_ledger_index")
    def store_ledger_index(self, key: str, index: LedgerIndex) -> None:
        """One link of a settled episode's chain of page lists (idempotent, verify-if-present)."""
        with io_attempt("store ledger index", key=key):
            self.store.put_if_absent(key, index.model_dump_json().encode())

    @activity.defn(name="load_ledger_page")
    def load_ledger_page(self, key: str) -> bytes:
        """One snapshot page, packed for the workflow (a fraction of its JSON's bytes in the history)."""
        gates = Gates.from_env()
        if gates is not None:  # tests only (grove/gates.py): hold a restore while a page loads
            gates.hold_sync("ledger_page_load", key)
        with io_attempt("load ledger page", key=key):
            return pack_page(LedgerPage.model_validate_json(self.store.get(key)))

    @activity.defn(name="load_completion")
    def load_completion(self, inp: LoadCompletionInput) -> Completion:
        """A claim-checked completion for the native harness (verified; capture/claims.py). Missing or
        different bytes are bad input (CompletionMissingError / CompletionDigestError, not retried);
        an unreachable store is retried like every IO read."""
        with io_attempt("load completion", key=inp.ref.key):
            return load_completion(self.store, inp.episode_id, inp.ref)
