"""An OpenAI Agents SDK program as a Temporal workflow (temporalio.contrib.openai_agents), its model calls
captured by grove: the integration runs each model call as an activity, where grove's ModelProvider sends
it to the episode with identity headers (harnesses/clients/agents_sdk.py).

Worker:   OpenAIAgentsPlugin(model_provider=GroveModelProvider()) on the client, `LeadWorkflow` on a queue
Start:    client.execute_workflow(LeadWorkflow.run, args=[base_url, token], ...)   (the episode's URL/token)
"""

from __future__ import annotations

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
