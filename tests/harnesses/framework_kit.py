"""Shared setup of the harness-framework e2e tests (LangGraph, OpenAI Agents SDK) on real services: an
external episode bound as a harness sees it (`Episode`: the gateway's episode URL and token), the ledger's
non-zero counts, and an episode's published rows, each checked against the calls the engine served.

The gateway, Temporal and engine fixtures stay where they are (tests/gateway/test_app_e2e.py's
`gateway_url`, tests/fixtures/); this kit holds what every framework test needs around them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.openai_agents import OpenAIAgentsPlugin
from temporalio.worker import Worker

from gateway.http.auth import issue_token
from harnesses.clients import Episode
from tests.e2e.test_acceptance import check_row_against_served
from tests.gateway.test_app_e2e import SECRET, base_url, start_episode
from trainer.rows import Row, rows_from_parquet


def bind(gateway_url: str, episode_id: str) -> Episode:
    """The episode as its harness gets it: `$GROVE_BASE_URL` and `$GROVE_API_KEY`."""
    return Episode(base_url(gateway_url, episode_id), issue_token(SECRET, episode_id))


async def external_episode(
    client, gateway_url: str, name: str, *, pinned: bool = False
) -> tuple[str, Episode]:
    """A fresh external episode (waiting for the harness's calls and its close) and its binding; `pinned`:
    a fixed id, so fixed replies to fixed requests (tests/gateway/test_app_e2e.py start_episode)."""
    episode_id = await start_episode(client, name, pinned=pinned)
    return episode_id, bind(gateway_url, episode_id)


def nonzero(counts: dict) -> dict:
    return {state: n for state, n in counts.items() if n}


def published_rows(store, rows_key: str) -> list[Row]:
    return rows_from_parquet(store.get(rows_key))


def rows_as_served(store, rows_key: str, served: dict) -> list[Row]:
    """The published rows, each one exactly the tokens, masks and logprobs the engine served."""
    rows = published_rows(store, rows_key)
    for row in rows:
        check_row_against_served(row, served)
    return rows


async def run_agents_workflow(address: str, provider, workflow, episode: Episode, params, timeout_s: float):
    """Run an Agents SDK program's workflow (`workflow.run(base_url, api_key)`) to its end on a worker of
    this process, with Temporal's integration (temporalio.contrib.openai_agents) and `provider` as the
    model provider of its activities; returns the workflow's result."""
    plugin = OpenAIAgentsPlugin(model_params=params, model_provider=provider)
    client = await Client.connect(address, plugins=[plugin])
    queue = f"agents-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=queue, workflows=[workflow]):
        return await client.execute_workflow(
            workflow.run,
            args=[episode.base_url, episode.api_key],
            id=f"program-{queue}",
            task_queue=queue,
            execution_timeout=timedelta(seconds=timeout_s),
        )
