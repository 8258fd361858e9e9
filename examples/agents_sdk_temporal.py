"""An OpenAI Agents SDK program as a Temporal workflow (temporalio.contrib.openai_agents), its model calls
captured by grove: the integration runs each model call as an activity, where grove's ModelProvider sends
it to the episode with identity headers (harnesses/clients/agents_sdk.py). This file is the whole program:
the workflow, a worker for it, the start, the close, and a report of what grove recorded.

    grove episode start --external --json          # prints base_url and token of a new episode
    export GROVE_BASE_URL=<base_url> GROVE_API_KEY=<token>
    python examples/agents_sdk_temporal.py         # Temporal at $GROVE_TEMPORAL_ADDRESS (127.0.0.1:7233)

The workflow sandbox imports this file again to check the workflow; everything that runs lives under the
`__main__` guard, and the SDK's imports are passed through the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner

    from harnesses.clients.agents_sdk import grove_run_config


def lead_agent() -> Agent:
    worker = Agent(name="Research worker", instructions="You research one topic and report briefly.")
    return Agent(
        name="Lead agent",
        instructions="You lead. Delegate research with the tool, then answer.",
        tools=[worker.as_tool(tool_name="research", tool_description="Research one topic.")],
    )


@workflow.defn
class LeadWorkflow:
    """Two turns of the lead: the task, then a follow-up on the same history (a continuation)."""

    @workflow.run
    async def run(self, base_url: str, api_key: str) -> str:
        config = grove_run_config(base_url, api_key)
        lead = lead_agent()
        first = await Runner.run(lead, "Fix the failing build.", run_config=config)
        follow_up = [*first.to_input_list(), {"role": "user", "content": "Go on."}]
        second = await Runner.run(lead, follow_up, run_config=grove_run_config(base_url, api_key))
        return str(second.final_output)


async def main() -> None:
    from temporalio.client import Client
    from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.worker import Worker

    from harnesses.clients import Episode
    from harnesses.clients.agents_sdk import GroveModelProvider
    from harnesses.clients.report import episode_report

    target = Episode.from_env()  # $GROVE_BASE_URL, $GROVE_API_KEY
    provider = GroveModelProvider()  # serves any episode: each call names its own in its settings
    plugin = OpenAIAgentsPlugin(
        # a model call on a busy CPU engine can take minutes; one retry mechanism: Temporal's
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(minutes=10)),
        model_provider=provider,
    )
    address = os.environ.get("GROVE_TEMPORAL_ADDRESS", "127.0.0.1:7233")
    client = await Client.connect(address, plugins=[plugin])
    queue = f"agents-example-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[LeadWorkflow]):
        answer = await client.execute_workflow(
            LeadWorkflow.run, args=[target.base_url, target.api_key], id=queue, task_queue=queue
        )
    episode = provider.bound(target.base_url, target.api_key)  # what the activities' responses named
    closed = await episode.aclose(final_answer=answer, wait=True)
    print(f"answer    {answer!r}")
    print(episode_report(episode, closed))


if __name__ == "__main__":
    asyncio.run(main())
