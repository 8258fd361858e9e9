"""What a finished episode yields: reward, rows, staging cleaned, its result (Temporal workflow code).

Once the harness is done and the ledger closed (workflows/episode.py), in this order:

- **reward**: the task family's scorer (`score_episode`). A failed episode scores 0 without it: its
  placeholder row carries no loss, only the metrics show it. An external harness that named no outputs is
  scored on each agent's last answer (`Ledger.last_outputs`).
- **rows**: `materialize_episode` rebuilds the forest into rows. A ledger that travels as pages is passed
  as its page keys (paged before its close; materialize applies the close: `CLOSE_REASON`), else inline.
- **staging cleaned**: the calls' token arrays and the episode's ledger pages; a failed episode's are kept
  when the spec asks (`keep_failed_staging`).
- **result**: counts per terminal state, call statistics and policy versions of every call of the episode.

A failed episode still materializes: one masked placeholder row that keeps its group intact, with the
reason in the result. A reward or materialization that cannot succeed (a typed error, or storage gone for
`IO_PATIENCE`) turns the episode into a failed one ("infrastructure") instead of failing the workflow;
only a placeholder that cannot be written fails it.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError

from grove.contracts import (
    LEDGER_OUTPUT_KINDS,
    CleanStagingInput,
    EpisodeResult,
    HarnessOutcome,
    MaterializeInput,
    MaterializeResult,
    RewardInput,
    RewardResult,
)
from grove.store_layout import ledger_prefix, rows_key
from ledger.accounting import LedgerAccounting
from ledger.handover import EpisodeRun
from ledger.ledger import Ledger
from workflows.episode_activities import io_activity
from workflows.episode_failures import failure_text
from workflows.step_metrics import TOOLS_OFFERED, call_stats

CLOSE_REASON = "harness finished"  # the reason the ledger's close gives the calls it cancels


async def score(
    spec: EpisodeRun, ledger: Ledger, outcome: HarnessOutcome
) -> tuple[float, HarnessOutcome, dict[str, float]]:
    """The reward, the outcome (failed when the reward could not be computed) and the reward's components
    (e.g. per agent)."""
    if outcome.failure is not None:
        return 0.0, outcome, {}  # a failed episode's placeholder carries no loss; only metrics show it
    inp = RewardInput(task=spec.task, outcome=outcome)
    if spec.harness.kind in LEDGER_OUTPUT_KINDS and not outcome.outputs:
        # The harness named no outputs: each agent's last answer, from the ledger
        inp = inp.model_copy(update={"episode_id": spec.episode_id, "output_calls": ledger.last_outputs()})
    try:
        result = await io_activity("score_episode", inp, RewardResult)
    except ActivityError as err:
        failure = f"reward failed: {failure_text(err)}"
        return 0.0, outcome.model_copy(update={"failure": failure, "failure_kind": "infrastructure"}), {}
    return result.reward, outcome, dict(result.details)


async def materialize(
    inp: MaterializeInput, outcome: HarnessOutcome
) -> tuple[MaterializeResult, HarnessOutcome]:
    """Rows, or (rows that cannot be built: a typed error, or storage gone for IO_PATIENCE) the
    placeholder row of a failed episode. Only a placeholder that cannot be written fails the workflow."""
    try:
        return await io_activity("materialize_episode", inp, MaterializeResult), outcome
    except ActivityError as err:
        if not inp.valid:
            raise
        failure = f"materialize failed: {failure_text(err)}"
        failed = outcome.model_copy(update={"failure": failure, "failure_kind": "infrastructure"})
    placeholder = inp.model_copy(update={"valid": False, "failure": failed.failure, "reward": 0.0})
    return await io_activity("materialize_episode", placeholder, MaterializeResult), failed


def materialize_input(
    spec: EpisodeRun,
    ledger: Ledger,
    outcome: HarnessOutcome,
    reward: float,
    pages: list[str] | None,
    ledger_index: str | None,
) -> MaterializeInput:
    """The rows of the closed ledger: inline, or (`pages`: it travels as pages) the keys of its pages
    and index chain, to which materialize applies the close."""
    inp = MaterializeInput(
        episode_id=spec.episode_id,
        group_id=spec.group_id,
        rows_key=rows_key(spec.episode_id),
        contexts=[],
        receipts=[],
        reward=reward,
        valid=outcome.failure is None,
        failure=outcome.failure,
        train_agents=spec.train_agents,
        train_auxiliary=spec.train_auxiliary,
    )
    if pages is not None:
        update = {"ledger_pages": pages, "close_reason": CLOSE_REASON, "ledger_index": ledger_index}
        return inp.model_copy(update=update)
    contexts = [c.record for c in ledger.contexts.values()]
    return inp.model_copy(update={"contexts": contexts, "receipts": ledger.receipts()})


async def clean_staging(spec: EpisodeRun, outcome: HarnessOutcome) -> None:
    keep = outcome.failure is not None and spec.keep_failed_staging
    inp = CleanStagingInput(
        episode_id=spec.episode_id, keep=keep, extra_prefixes=[ledger_prefix(spec.episode_id)]
    )
    await io_activity("clean_staging", inp, None)


def episode_result(
    spec: EpisodeRun,
    ledger: Ledger,
    accounting: LedgerAccounting,
    outcome: HarnessOutcome,
    reward: float,
    reward_details: dict[str, float],
    rows: MaterializeResult,
) -> EpisodeResult:
    counts, stats, versions = _result_numbers(ledger, accounting, rows)
    return EpisodeResult(
        episode_id=spec.episode_id,
        group_id=spec.group_id,
        task_id=spec.task.task_id,
        status="failed" if outcome.failure else "ok",
        reward=reward,
        rows_key=rows.rows_key,
        num_rows=rows.num_rows,
        eligible_tokens=rows.eligible_tokens,
        counts=counts,
        failure=outcome.failure,
        reward_details=reward_details,
        failure_kind=outcome.failure_kind if outcome.failure is not None else None,
        call_stats=stats,
        policy_versions=versions,
        summary_calls_trained=rows.summary_calls_trained,
        summary_tokens_trained=rows.summary_tokens_trained,
    )


def _result_numbers(
    ledger: Ledger, accounting: LedgerAccounting, rows: MaterializeResult
) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """Counts per terminal state, call_stats and policy versions of every call of the episode.

    A settled ledger no longer holds every call: materialize's join of the pages answers (the rows'
    own source), else (a placeholder whose pages could not be read) the ledger's settled tails."""
    live_versions = {c.policy_version for c in ledger.calls.values() if c.policy_version is not None}
    stats = call_stats(ledger.calls.values(), (c.record for c in ledger.contexts.values()))
    if not ledger.settled:
        counts = {state.value: len(ids) for state, ids in accounting.by_state.items() if ids}
        return counts, stats, sorted(live_versions)
    totals = ledger.settled_totals
    for outcome, n in totals.tool_calls.items():
        stats[TOOLS_OFFERED] += n
        stats[f"tool_calls_{outcome.value}"] += n
    counts = {state.value: n for state, n in ledger.closed_counts().items() if n}
    return (
        rows.counts if rows.counts is not None else counts,
        rows.call_stats if rows.call_stats is not None else stats,
        rows.policy_versions
        if rows.policy_versions is not None
        else sorted(live_versions | set(totals.policy_versions)),
    )
