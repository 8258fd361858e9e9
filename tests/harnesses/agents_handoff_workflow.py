"""The handoff program of the Agents SDK script model as a Temporal workflow (temporalio.contrib.
openai_agents): its model calls run as activities through grove's provider. Its own module, with nothing
but the workflow: the workflow sandbox re-imports it."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Runner

    from harnesses.clients.agents_sdk import grove_run_config
    from tests.harnesses.agents_stream_model import ROUTE_USER, front_desk, script_settings


@workflow.defn
class HandoffWorkflow:
    """The front desk hands the request off to the specialist, who answers."""

    @workflow.run
    async def run(self, base_url: str, api_key: str) -> str:
        config = grove_run_config(base_url, api_key)
        result = await Runner.run(front_desk(script_settings()), ROUTE_USER, run_config=config)
        return str(result.final_output)
