"""Real OpenCode traffic through the gateway's pure decisions (fast: no services).

`fixtures/opencode-run-two-tasks.requests.jsonl` holds the four requests stock OpenCode 1.18.33 sent for
one `opencode run` with the restricted `lead` agent (harnesses/opencode.py restricted_agents) when the
server made the lead call `task` twice: the lead's first request, the two subagent sessions' requests
(sent concurrently, with `x-parent-session-id`), and the lead's resumption with both task results. The
responses are implied by the requests that follow them (OpenCode echoes them back). This test names the
sessions, routes and decides each request against a real ledger the way gateway/pipeline/planning.py does: the
subagents are named after their agent type (`worker`, then `worker-2`), in the order the lead wrote the
`task` calls, whichever subagent's request comes first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.records import ChatRecord, Usage
from gateway.pipeline.continuation import Move, decide
from gateway.pipeline.launch_records import launch_of, prompt_digest
from gateway.pipeline.opencode_names import session_names
from gateway.pipeline.routing import current_context, identify, route, view_request
from grove.receipts import CallKind, ContextOrigin
from ledger.context_view import ViewRequest, context_view
from storage.local import LocalStore
from tests.forest.kit import Episode, tokens

REQUESTS = Path(__file__).parent / "fixtures" / "opencode-run-two-tasks.requests.jsonl"


def load() -> list[dict]:
    return [json.loads(line) for line in REQUESTS.read_text().splitlines()]


def head_of(ledger):
    """The call that spawns an agent's workers now: its current context's head, as the gateway asks it
    (gateway/pipeline/planning.py `head_of`)."""

    async def head(agent: str) -> str | None:
        view = context_view(ledger, ViewRequest(agents=[agent]), closing=False)
        return getattr(current_context(view, agent), "head", None)

    return head


@pytest.mark.parametrize("subagents_swapped", [False, True])
async def test_two_concurrent_subagents_and_the_resumption_route_and_continue(tmp_path, subagents_swapped):
    reqs = load()
    if subagents_swapped:  # the second subagent's request reaches the gateway first
        reqs = [reqs[0], reqs[2], reqs[1], reqs[3]]
    store = LocalStore(tmp_path)
    lead_response = reqs[3]["body"]["messages"][2]  # the lead's task calls, as OpenCode echoes them
    assert [c["function"]["name"] for c in lead_response["tool_calls"]] == ["task", "task"]
    ep = Episode()
    records: dict[str, ChatRecord] = {}
    responses = [lead_response, *({"role": "assistant", "content": r["body"]["messages"][-1]["content"]}
                                  for r in reqs[1:3])]  # fmt: skip
    moves, agents = [], []

    async def load_record(call_id: str):
        return records.get(call_id)

    for i, req in enumerate(reqs):
        body, headers = req["body"], {k.lower(): v for k, v in req["headers"].items()}
        assert launch_of(headers) == 1
        names = await session_names(
            store, ep.episode_id, headers, body["messages"], head_of(ep.ledger), load_record, {}
        )
        view = context_view(ep.ledger, view_request(headers, names), closing=False)
        identity = identify(headers, body["messages"], body.get("tools"), view, names)
        target = route(view, identity)
        head = records.get(target.current.head) if target.current and target.current.head else None
        decision = decide(body["messages"], body.get("tools"), head, identity.rewrite)
        moves.append(decision.move)
        agents.append(target.agent)
        if target.opening is not None:
            ep.ledger.open_context(target.opening)
        call_id = f"{target.context_id}.c{len(ep.ledger.contexts[target.context_id].call_ids)}"
        extends = head.call_id if decision.move == Move.CONTINUE else None
        # stand-in token arrays: a continuation's prompt starts with its parent's prompt + completion
        prompt = [1, 2, 3, 9] if extends else [1, 2]
        ep.call(call_id, target.context_id, tokens(prompt, [3], [-1.0]), extends=extends)
        records[call_id] = ChatRecord(
            episode_id=ep.episode_id, call_id=call_id, context_id=target.context_id, agent=target.agent,
            kind=CallKind.ACTION, extends=extends, messages=body["messages"], tools=body.get("tools"),
            response=responses[i] if i < 3 else {"role": "assistant", "content": "apple pear"},
            finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=1), policy_version=0,
        )  # fmt: skip
    asked = [r["body"]["messages"][-1]["content"] for r in reqs[1:3]]
    by_prompt = dict(zip(asked, agents[1:3], strict=True))
    # the lead called `task` for "Say apple" first: that subagent is `worker` whenever it arrives
    assert by_prompt == {"Say apple": "worker", "Say pear": "worker-2"}
    assert agents[0] == agents[3] == "parent"
    assert moves == [Move.ROOT, Move.ROOT, Move.ROOT, Move.CONTINUE]
    contexts = ep.ledger.summary().contexts
    workers = [c for c in contexts if c.agent != "parent"]
    assert [(c.origin, c.spawned_by_call) for c in workers] == [(ContextOrigin.SPAWN, "parent.0.c0")] * 2
    # the resumption's tool results carry the workers' session ids: a relaunch re-sends other ids there,
    # so only the requests before it can be answered from records; they digest equal to themselves only
    digests = {prompt_digest(r["body"]["messages"], r["body"].get("tools")) for r in reqs}
    assert len(digests) == 4
