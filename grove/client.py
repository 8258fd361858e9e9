"""Connecting to Temporal the way every grove process must: with the pydantic data converter."""

from __future__ import annotations

import os

from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

DEFAULT_ADDRESS = "127.0.0.1:7233"


def temporal_address() -> str:
    return os.environ.get("GROVE_TEMPORAL_ADDRESS", DEFAULT_ADDRESS)


async def connect(address: str | None = None, namespace: str = "default") -> Client:
    """A client whose payloads are pydantic v2 models (client and workers must agree on this)."""
    return await Client.connect(
        address or temporal_address(), namespace=namespace, data_converter=pydantic_data_converter
    )


async def workflow_runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run's history of `workflow_id`, first to last: from the latest run back along each run's
    `continued_execution_run_id` (a continue-as-new chain, e.g. an episode's hand-overs)."""
    runs, run_id = [], None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        runs.append(history)
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return runs[::-1]
