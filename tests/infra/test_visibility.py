"""One run's workflows, selected by `GroveRun` (grove/visibility.py), on a real dev server: run ids with
quotes or a backslash find their own workflows and nothing of look-alike runs; a plain id's clause
alone selects exactly its run."""

from __future__ import annotations

import asyncio
import uuid

from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from grove.visibility import GROVE_RUN, of_run, run_clause

VISIBLE_WAIT_S = 60.0


async def start_tagged(client: Client, grove_run: str) -> str:
    """A workflow no worker picks up (it stays Running), tagged with `grove_run`: its id."""
    workflow_id = f"visibility-{uuid.uuid4().hex}"
    await client.start_workflow(
        "NoSuchWorkflow", id=workflow_id, task_queue=f"nobody-{uuid.uuid4().hex}",
        search_attributes=TypedSearchAttributes([SearchAttributePair(GROVE_RUN, grove_run)]),
    )  # fmt: skip
    return workflow_id


async def selected(client: Client, grove_run: str, *, exact: bool = True) -> set[str]:
    """Ids the run's clause lists (kept by `of_run` when `exact`), among this test's workflows."""
    query = f"WorkflowId STARTS_WITH 'visibility-' AND {run_clause(grove_run)}"
    return {e.id async for e in client.list_workflows(query) if not exact or of_run(e, grove_run)}


async def until_listed(client: Client, ids: set[str]) -> None:
    """Until the server lists all of `ids` (visibility is written after the start returns)."""
    deadline = asyncio.get_running_loop().time() + VISIBLE_WAIT_S
    query = "WorkflowId STARTS_WITH 'visibility-'"
    while not ids <= {e.id async for e in client.list_workflows(query)}:
        assert asyncio.get_running_loop().time() < deadline, f"not all listed in {VISIBLE_WAIT_S} s"
        await asyncio.sleep(0.2)


async def test_each_run_id_selects_its_own_workflows_only(temporal_client: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    values = [
        f"""it's "{tag}" \\ run""", f"""it's "{tag}" \\\\ run""", f"it's {tag} run", f'say "{tag}"',
        f"back\\slash-{tag}", f"back\\\\slash-{tag}", f"plain-{tag}", "it",
    ]  # fmt: skip
    ids = {value: await start_tagged(temporal_client, value) for value in values}
    try:
        await until_listed(temporal_client, set(ids.values()))
        for value, workflow_id in ids.items():
            assert await selected(temporal_client, value) == {workflow_id}, value
        # a plain id needs no filtering: its clause alone is exact
        assert await selected(temporal_client, f"plain-{tag}", exact=False) == {ids[f"plain-{tag}"]}
    finally:
        for workflow_id in ids.values():
            await temporal_client.get_workflow_handle(workflow_id).terminate("test done")
