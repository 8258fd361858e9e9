"""Wedged episodes end instead of stalling their step: the episodes worker's sweep.

An episode whose workflow task fails on every attempt can never finish: its step (or evaluation) waits
on it until the run's bound, `RunConfig.episode_timeout_s` (an hour by default). Seen five times on a
loaded 2-core machine: the SQLite dev server failed its own writes (`context canceled`) around a workflow
task that carried an activity result and a new Update, and wrote a history that no replay can follow
(docs/reliability.md). Nondeterminism errors already fail the episode at once (workflows/episode.py,
EPISODE_FAILURE_TYPES); these fail with the SDK core's `Fatal error in workflow machines`, which Temporal
always retries.

Temporal flags such a workflow itself: the server sets the `TemporalReportedProblems` search attribute
after N consecutive failed or timed-out workflow tasks (dynamic config
`system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute`, 5 by default; grove's dev server
starts with 3, infra/temporal.py) and clears it on the first success. The sweep lists the running
episodes so flagged, confirms on each one's own description that its workflow task is still at it (a
pending task at attempt >= the bar of its problem, MIN_ATTEMPTS_BY_PROBLEM: 3 failed tasks; the
listing may lag a recovery), and terminates it with the cause in the reason. The run counts a terminated
child as an infrastructure failure (no rows, out of its group's baseline) and the step goes on. Only
episodes: a run workflow keeps waiting for a fixed worker.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from grove.visibility import of_run, run_clause

log = logging.getLogger(__name__)

PROBLEMS = "TemporalReportedProblems"
# consecutive attempts after which an episode counts as wedged, per kind of problem the server reports.
# Failed tasks only: a task that fails fails again (the same history, the same code). Tasks that time out
# are left to the run's bound: a worker too loaded to finish one in time may recover, and the dev server's
# flag for timed-out tasks could not be made to appear in a test (docs/reliability.md).
MIN_ATTEMPTS_BY_PROBLEM = {"category=WorkflowTaskFailed": 3}
SWEEP_EVERY_S = 60.0


class WedgedEpisode(BaseModel):
    """A running episode whose workflow task has failed `attempt` times in a row."""

    episode_id: str
    run_id: str  # the workflow run's id
    attempt: int
    problems: list[str]  # the server's TemporalReportedProblems, e.g. cause=WorkflowTaskFailedCause...

    def reason(self) -> str:
        return (
            f"wedged: its workflow task failed {self.attempt} times in a row ({', '.join(self.problems)}); "
            "ended by the episodes worker's sweep (activities/wedged_episodes.py) so its step goes on"
        )


def wedged_query(grove_run: str | None = None) -> str:
    query = f'WorkflowType="EpisodeWorkflow" AND ExecutionStatus="Running" AND {PROBLEMS} IS NOT NULL'
    return query + (f" AND {run_clause(grove_run)}" if grove_run else "")


async def find_wedged(
    client: Client, *, min_attempts: dict[str, int] = MIN_ATTEMPTS_BY_PROBLEM, grove_run: str | None = None
) -> list[WedgedEpisode]:
    """Running episodes the server flags whose pending workflow task is at an attempt >= the bar of the
    problem flagged (`min_attempts`: category -> attempts; `grove_run`: only that run's episodes)."""
    found = []
    async for execution in client.list_workflows(wedged_query(grove_run)):
        if grove_run is not None and not of_run(execution, grove_run):
            continue  # another run's (an id the query cannot match exactly: grove/visibility.py)
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                continue  # gone since the listing
            raise
        raw = described.raw_description
        if described.status != WorkflowExecutionStatus.RUNNING or not raw.HasField("pending_workflow_task"):
            continue
        attempt = raw.pending_workflow_task.attempt
        problems = [str(p) for p in (execution.search_attributes or {}).get(PROBLEMS, [])]
        bars = [min_attempts[p] for p in problems if p in min_attempts]
        if bars and attempt >= min(bars):
            found.append(
                WedgedEpisode(
                    episode_id=execution.id, run_id=execution.run_id, attempt=attempt, problems=problems
                )
            )
    return found


async def end_wedged(
    client: Client, *, min_attempts: dict[str, int] = MIN_ATTEMPTS_BY_PROBLEM, grove_run: str | None = None
) -> list[WedgedEpisode]:
    """Terminate every wedged episode (find_wedged); returns those this call ended."""
    ended = []
    for wedged in await find_wedged(client, min_attempts=min_attempts, grove_run=grove_run):
        handle = client.get_workflow_handle(wedged.episode_id, run_id=wedged.run_id)
        try:
            await handle.terminate(reason=wedged.reason())
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                continue  # closed meanwhile (another worker's sweep, its bound, or it finished)
            raise
        log.warning("ended wedged episode %s: %s", wedged.episode_id, wedged.reason())
        ended.append(wedged)
    return ended


async def sweep_forever(
    client: Client, every_s: float = SWEEP_EVERY_S, min_attempts: dict[str, int] = MIN_ATTEMPTS_BY_PROBLEM
) -> None:
    """end_wedged every `every_s` seconds until cancelled; a sweep that fails (server unreachable) is
    logged and tried again at the next one."""
    while True:
        try:
            await end_wedged(client, min_attempts=min_attempts)
        except Exception:  # noqa: BLE001 - the sweep must outlive a server that is down for a while
            log.exception("wedged-episode sweep failed; next try in %.0f s", every_s)
        await asyncio.sleep(every_s)
