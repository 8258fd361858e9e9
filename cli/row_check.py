"""The reading behind `grove episode check ID` and `grove run check RUN`: each closed episode's rows, call
archive, result and spec (what it trains), audited by cli/row_audit.py.

    grove run check demo-parent-and-workers            # every step's episodes
    grove run check demo-parent-only --step 3 --json
    grove episode check adhoc/3f2a9c

What the episode trains (`train_agents`, `train_auxiliary`) comes from the episode's own start input, so a
hand-started episode is checked as it was started. Running episodes are listed and not checked; an
episode without a call archive (closed before archives existed) fails the check: nothing can vouch for it.
"""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from capture.call_archive import load_archive
from cli.row_audit import EpisodeAudit, audit_episode
from cli.runs import RunNotFoundError, run_progress, step_episodes, step_history
from grove.contracts import EpisodeResult, EpisodeSpec
from storage.base import ObjectNotFoundError, ObjectStore
from trainer.rows import rows_from_parquet


class EpisodeNotClosedError(LookupError):
    """The episode is not a completed workflow (unknown, running, failed or terminated)."""


async def episode_spec(client: Client, episode_id: str) -> EpisodeSpec:
    """The spec the episode was started with: the input of the first run of its continue-as-new chain."""
    run_id = None
    while True:
        handle = client.get_workflow_handle(episode_id, run_id=run_id)
        first = None
        async for event in handle.fetch_history_events(page_size=1):
            first = event
            break
        if first is None:
            raise EpisodeNotClosedError(f"episode {episode_id!r}: no history on the server")
        attrs = first.workflow_execution_started_event_attributes
        if not attrs.continued_execution_run_id:
            [spec] = await client.data_converter.decode(attrs.input.payloads, [EpisodeSpec])
            return spec
        run_id = attrs.continued_execution_run_id


async def closed_result(client: Client, episode_id: str) -> EpisodeResult:
    handle = client.get_workflow_handle(episode_id, result_type=EpisodeResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        raise EpisodeNotClosedError(f"episode {episode_id!r} is not on the server ({err.message})") from err
    if desc.status != WorkflowExecutionStatus.COMPLETED:
        status = desc.status.name if desc.status else "UNKNOWN"
        raise EpisodeNotClosedError(
            f"episode {episode_id!r} is {status}: only a completed episode has rows to check (close it, or "
            "wait for its run's step)"
        )
    return await handle.result()


async def check_episode(client: Client, store: ObjectStore, episode_id: str) -> EpisodeAudit:
    """One completed episode's audit (EpisodeNotClosedError for any other)."""
    result = await closed_result(client, episode_id)
    spec = await episode_spec(client, episode_id)
    archive = load_archive(store, episode_id)
    if archive is None:
        return EpisodeAudit(episode_id, violations=[f"episode {episode_id}: no call archive in the store"])
    rows = []
    if result.num_rows:
        try:
            rows = rows_from_parquet(store.get(result.rows_key))
        except ObjectNotFoundError:
            return EpisodeAudit(
                episode_id, violations=[f"episode {episode_id}: rows {result.rows_key} missing"]
            )
    return audit_episode(archive, rows, result, spec.train_agents, spec.train_auxiliary)


async def check_run(
    client: Client, store: ObjectStore, run_id: str, steps: list[int] | None = None
) -> tuple[list[EpisodeAudit], list[str]]:
    """The audits of the run's completed episodes (of `steps`, default every recorded step), and the ids of
    its episodes left unchecked because they are not completed."""
    desc, state, result = await run_progress(client, run_id)
    recorded = result or state
    if recorded is None:  # running with no worker answering its progress query, or failed/terminated
        status = desc.status.name if desc.status else "UNKNOWN"
        raise RunNotFoundError(
            f"run {run_id!r} is {status} and gave no step records (a running run's come from its progress "
            "query, which a worker answers): start its workers, or check its episodes one by one with "
            "`grove episode check`"
        )
    history = step_history(store, run_id, recorded.history, recorded.history_from)
    wanted = set(steps) if steps else {r.step for r in history}
    audits, unchecked = [], []
    for step in sorted(wanted):
        for episode in await step_episodes(client, run_id, step, missing_ok=True):
            if episode["workflow_status"] != "COMPLETED":
                unchecked.append(episode["episode_id"])
                continue
            audits.append(await check_episode(client, store, episode["episode_id"]))
    return audits, unchecked


def report(audits: list[EpisodeAudit], unchecked: list[str]) -> tuple[str, int]:
    """The text report and the number of failing episodes."""
    lines = []
    for audit in audits:
        lines.append(audit.line())
        lines += [f"     - {v}" for v in audit.violations]
    lines += [f"skip {eid}  (not completed)" for eid in unchecked]
    failing = sum(not a.ok for a in audits)
    trained = sum(a.trained_tokens for a in audits)
    lines.append(
        f"{len(audits)} episodes checked, {failing} failing, {len(unchecked)} not completed; "
        f"{sum(a.rows for a in audits)} rows, {trained} trained tokens"
    )
    return "\n".join(lines), failing
