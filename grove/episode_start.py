"""Starting an episode by hand (an external harness's): one workflow id, one episode, ever.

An episode's id names everything it leaves behind: its rows (`rows/{episode}.parquet`), its staging and
ledger pages, its gateway URL and token. Temporal's default lets a workflow id be used again once the
workflow with it has ended, so an external episode started under the id of a finished one ran, and failed
only at its materialization (`DigestMismatchError: rows/... already holds different bytes`). Here a start
under an id Temporal has seen before, running or ended (within the namespace's retention), is refused at
once with `EpisodeIdReusedError`, which names the existing episode (its run, status and start time);
`grove episode start` exits with its conflict code and the gateway maps the error to HTTP 409.

Training runs start their episodes as child workflows under ids of their own (run/step/task/group),
which this module does not change.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from grove import queues
from grove.contracts import EpisodeSpec

EPISODE_WORKFLOW = "EpisodeWorkflow"


class EpisodeIdReusedError(Exception):
    """An episode started under the id of an existing or finished episode (HTTP 409)."""

    def __init__(self, message: str, *, episode_id: str, run_id: str | None, status: str | None) -> None:
        super().__init__(message)
        self.episode_id, self.run_id, self.status = episode_id, run_id, status


async def start_episode(client: Client, spec: EpisodeSpec, **options: Any) -> WorkflowHandle:
    """Start `spec`'s EpisodeWorkflow on the episodes queue under `spec.episode_id`, never a second time;
    `options` go to `Client.start_workflow` (memo, search attributes, timeouts)."""
    try:
        return await client.start_workflow(
            EPISODE_WORKFLOW, spec, id=spec.episode_id, task_queue=queues.EPISODES,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL, **options,
        )  # fmt: skip
    except WorkflowAlreadyStartedError:
        raise await _reused(client, spec.episode_id) from None


async def _reused(client: Client, episode_id: str) -> EpisodeIdReusedError:
    desc = await client.get_workflow_handle(episode_id).describe()
    status = desc.status.name if desc.status is not None else None
    started = desc.start_time.isoformat() if desc.start_time else "?"
    return EpisodeIdReusedError(
        f"episode id {episode_id!r} is taken: workflow {desc.workflow_type!r} (run {desc.run_id}) started "
        f"{started} is {status}; an episode id names its rows, staging and ledger pages, so it is never "
        "used twice. Start the new episode under a new id",
        episode_id=episode_id,
        run_id=desc.run_id,
        status=status,
    )
