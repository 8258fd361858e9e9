"""Which call handed off to an agent, read from the agent's input (harnesses/clients/agents_handoffs.py), on
the SDK's own agents, handoffs and item shapes; the e2e tests run real handoffs (test_agents_sdk_e2e.py,
test_agents_sdk_stream_e2e.py)."""

from __future__ import annotations

import json

from agents import Agent, handoff

from harnesses.clients import ReadableAgents, header_safe
from harnesses.clients.agents_handoffs import FAKE_ID, handoff_spawner, handoff_targets
from harnesses.clients.agents_sdk import IdentityFilter

SPECIALIST = Agent(name="Billing specialist", instructions="Bills.")
REFUNDS = Agent(name="Refunds", instructions="Refunds.")
FRONT = Agent(
    name="Front desk",
    instructions="Routes.",
    handoffs=[SPECIALIST, handoff(REFUNDS, tool_name_override="to_refunds")],
)
TARGETS = handoff_targets(FRONT)


def call(tool: str, call_id: str, item_id: str = "parent.0.c0") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": tool, "arguments": "{}"}


def output(call_id: str, agent: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": json.dumps({"assistant": agent})}


def said(item_id: str, text: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "role": "assistant", "id": item_id, "content": content}


USER = {"role": "user", "content": "My bill is wrong."}
ENTERS = [USER, call("transfer_to_billing_specialist", "c1"), output("c1", SPECIALIST.name)]


def test_the_sdks_tool_names_map_to_the_agents_they_transfer_to():
    assert TARGETS == {"transfer_to_billing_specialist": "Billing specialist", "to_refunds": "Refunds"}


def test_the_request_that_enters_the_target_names_the_handing_off_call():
    assert handoff_spawner(ENTERS, SPECIALIST.name, TARGETS) == "parent.0.c0"
    assert handoff_spawner(ENTERS, FRONT.name, TARGETS) is None  # not its handoff
    assert handoff_spawner(ENTERS, REFUNDS.name, TARGETS) is None
    refund = [USER, call("to_refunds", "c2", "parent.0.c1"), output("c2", REFUNDS.name)]
    assert handoff_spawner(refund, REFUNDS.name, TARGETS) == "parent.0.c1"  # a custom tool name


def test_later_requests_of_the_target_continue_and_name_no_spawner():
    later = [*ENTERS, said("Billing-specialist.0.c0", "Let me check."), {"role": "user", "content": "ok"}]
    assert handoff_spawner(later, SPECIALIST.name, TARGETS) is None
    # handed back and forth: the last entry counts, spawned by the call that handed it back
    back = [
        *later,
        call("transfer_to_billing_specialist", "c3", "parent.1.c0"),
        output("c3", SPECIALIST.name),
    ]
    assert handoff_spawner(back, SPECIALIST.name, TARGETS) == "parent.1.c0"


def test_nothing_to_read_names_no_spawner():
    unstamped = [USER, call("transfer_to_billing_specialist", "c1", FAKE_ID), output("c1", SPECIALIST.name)]
    assert handoff_spawner(unstamped, SPECIALIST.name, TARGETS) is None  # not grove's model
    assert handoff_spawner("a plain string input", SPECIALIST.name, TARGETS) is None
    filtered = [USER]  # an input filter that removed the handoff's tool items
    assert handoff_spawner(filtered, SPECIALIST.name, TARGETS) is None


def test_the_identity_filter_sends_the_spawner_once_it_saw_who_may_hand_off():
    identity = IdentityFilter()
    # the run's first agent, the root, under its own name
    assert identity.identity(FRONT, [USER]) == {"x-grove-agent": "Front-desk"}
    identity._handoffs.update(handoff_targets(FRONT))  # as __call__ does for every agent it sees
    entered = identity.identity(SPECIALIST, ENTERS)
    assert entered == {"x-grove-agent": "Billing-specialist", "x-grove-spawned-by": "parent.0.c0"}


def test_a_fixed_root_agent_id_is_kept():
    assert IdentityFilter("parent").identity(FRONT, [USER]) == {"x-grove-agent": "parent"}


def test_agent_ids_read_as_names_and_distinct_names_stay_distinct():
    ids = ReadableAgents()
    assert [ids("Research agent"), ids("worker-1"), ids("Research agent")] == [
        "Research-agent",
        "worker-1",
        "Research-agent",
    ]
    clash = ids("Research-agent")  # another name with the same slug: header_safe's hashed form
    assert clash.startswith("Research-agent-") and len(clash) == len("Research-agent-") + 8
    assert ids("Research.agent") not in {"Research-agent", clash}
    assert ids("  ") == header_safe("  ") and ids("x" * 200) == header_safe("x" * 200)
