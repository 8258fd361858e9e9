"""Gateway rules that fit real harnesses, on real services: uvicorn, the Temporal dev
server, a grove worker with a real vLLM engine on the tiny model, a local object store (the fixtures of
test_app_e2e.py).

Harnesses are played by the `openai` client the way LangGraph / the Agents SDK drive it: a worker
invoked twice with a fresh history, workers without a spawner, agent names with spaces, a summary call
and a summarised history with and without grove's headers, a close without outputs. What was admitted is
read from the workflow's `summary` query, what was served from the engine.
"""

from __future__ import annotations

import asyncio
import uuid

import openai
import pytest

from gateway.pipeline.identity import canonical_agent
from grove import queues
from grove.contracts import EpisodeSpec, HarnessOutcome, HarnessSpec
from grove.receipts import ContextOrigin
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import (  # noqa: F401  (gateway_url is a fixture)
    MODEL,
    SYSTEM,
    TOOLS,
    assistant_of,
    close,
    contexts,
    delivered_summary,
    extension_of,
    gateway_url,
    oai,
    summary,
)

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


async def start(client, name: str, **options) -> str:
    run = f"gwh-{name}-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8), **options,
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


def user(text: str) -> dict:
    return {"role": "user", "content": text}


async def chat(client: openai.AsyncOpenAI, messages: list, **kw):
    """(assistant message as a harness echoes it, the response's grove headers)."""
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kw)
    grove = {k: v for k, v in raw.headers.items() if k.startswith("x-grove-")}
    return assistant_of(raw.parse().choices[0].message), grove


async def test_a_worker_invoked_again_with_a_fresh_history_is_a_new_spawn(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
):
    """A second `as_tool` call / `Send` round gives the same worker a fresh history: a new SPAWN context
    linked to the new spawning call (before: 400 UndeclaredDiscontinuityError); the first invocation's
    context stays live and still continues; two concurrent invocations get two contexts."""
    eid = await start(temporal_client, "respawn")
    parent = oai(gateway_url, eid)
    task = [SYSTEM, user("Delegate twice.")]
    p0, h = await chat(parent, task, tools=TOOLS)
    worker = oai(gateway_url, eid, **{"x-grove-agent": "counter", "x-grove-spawned-by": h["x-grove-call-id"]})
    first = [SYSTEM, user("Count the a's in banana.")]
    w0, h = await chat(worker, first)
    assert h["x-grove-call-id"] == "counter.0.c0"
    p1, h = await chat(parent, [*task, p0, user("worker said: " + (w0["content"] or ""))], tools=TOOLS)
    assert h["x-grove-call-id"] == "parent.0.c1"
    again = oai(gateway_url, eid, **{"x-grove-agent": "counter", "x-grove-spawned-by": "parent.0.c1"})
    _, h = await chat(again, [SYSTEM, user("Count the b's in banana.")])
    assert h["x-grove-call-id"] == "counter.1.c0"
    # the first invocation's context is still live: its continuation extends it exactly
    _, h = await chat(worker, [*first, w0, user("Are you sure?")])
    assert h["x-grove-call-id"] == "counter.0.c1"
    assert extension_of(recording_engine, eid, "counter.0.c1", "counter.0.c0")
    # two invocations at once from one response (the same spawner), one with the very first request
    # again: two new contexts, nothing discarded as a retry
    results = await asyncio.gather(
        chat(again, first), chat(again, [SYSTEM, user("Count the n's in banana.")])
    )
    assert sorted(h["x-grove-call-id"] for _, h in results) == ["counter.2.c0", "counter.3.c0"]
    s = await summary(temporal_client, eid)
    ctx = contexts(s)
    links = {
        c: (ctx[c].origin, ctx[c].spawned_by_call, ctx[c].retired_by) for c in ctx if c.startswith("counter")
    }
    assert links == {
        "counter.0": (ContextOrigin.SPAWN, "parent.0.c0", None),
        "counter.1": (ContextOrigin.SPAWN, "parent.0.c1", None),
        "counter.2": (ContextOrigin.SPAWN, "parent.0.c1", None),
        "counter.3": (ContextOrigin.SPAWN, "parent.0.c1", None),
    }
    assert s.totals["discarded"] == 0 and s.warnings == []
    r = await close(gateway_url, eid, {"final_answer": "done"}, wait=True)
    assert r.json()["result"]["counts"] == {"selected": 7}


async def test_a_worker_without_a_spawner_is_warned_about_or_refused(gateway_url, temporal_client):  # noqa: F811
    eid = await start(temporal_client, "unspawned")
    await chat(oai(gateway_url, eid), [SYSTEM, user("Plan.")])
    _, h = await chat(oai(gateway_url, eid, **{"x-grove-agent": "helper"}), [SYSTEM, user("Help.")])
    assert h["x-grove-call-id"] == "helper.0.c0"
    [warning] = (await summary(temporal_client, eid)).warnings
    assert "'helper' has no spawner" in warning and "x-grove-spawned-by" in warning

    strict = await start(temporal_client, "strict", unspawned_agents="refuse")
    await chat(oai(gateway_url, strict), [SYSTEM, user("Plan.")])
    before = await delivered_summary(temporal_client, strict)
    with pytest.raises(openai.BadRequestError) as err:
        await chat(oai(gateway_url, strict, **{"x-grove-agent": "helper"}), [SYSTEM, user("Help.")])
    error = err.value.body
    assert (error["code"], error["param"]) == ("UnspawnedAgentError", "x-grove-spawned-by")
    assert "x-grove-spawned-by" in error["message"] and "'helper'" in error["message"]
    assert await summary(temporal_client, strict) == before
    # the same worker naming its spawner is accepted; auxiliary calls are no agents of their own
    spawned = oai(gateway_url, strict, **{"x-grove-agent": "helper", "x-grove-parent-context": "parent.0"})
    _, h = await chat(spawned, [SYSTEM, user("Help.")])
    assert h["x-grove-call-id"] == "helper.0.c0"
    _, h = await chat(oai(gateway_url, strict, **{"x-grove-call-kind": "auxiliary"}), [user("Title?")])
    assert h["x-grove-agent"] == "parent~aux" and (await summary(temporal_client, strict)).warnings == []


async def test_agent_names_with_spaces_dots_and_colons_are_accepted(gateway_url, temporal_client):  # noqa: F811
    eid = await start(temporal_client, "names")
    _, h = await chat(oai(gateway_url, eid), [SYSTEM, user("Delegate.")])
    names = ["Math Tutor", "team.lead", "role:critic"]
    for name in names:
        client = oai(gateway_url, eid, **{"x-grove-agent": name, "x-grove-spawned-by": h["x-grove-call-id"]})
        _, got = await chat(client, [SYSTEM, user(f"You are {name}.")])
        assert got["x-grove-agent"] == canonical_agent(name) and got["x-grove-agent"] != name
        assert got["x-grove-call-id"] == f"{canonical_agent(name)}.0.c0"
    agents = {c.agent for c in (await summary(temporal_client, eid)).contexts}
    assert agents == {"parent", *(canonical_agent(n) for n in names)}


async def test_common_wiring_mistakes_are_refused_naming_the_header_that_fixes_them(
    gateway_url,  # noqa: F811
    temporal_client,
):
    eid = await start(temporal_client, "mistakes")
    parent = oai(gateway_url, eid)
    task = [SYSTEM, user("Long task.")]
    p0, _ = await chat(parent, task, tools=TOOLS)
    before = await delivered_summary(temporal_client, eid)
    cases = {
        # a worker that sends no identity header at all lands in the parent's context
        "no headers": (parent, [{"role": "system", "content": "You are a worker."}, user("Count.")], TOOLS),
        # LangChain's summary call: no tools, one user message
        "summary call": (parent, [user("Summarise the conversation so far.")], None),
    }
    expect = {
        "no headers": ("MissingIdentityHeadersError", "x-grove-agent"),
        "summary call": ("UndeclaredAuxiliaryCallError", "x-grove-call-kind: auxiliary"),
    }
    for name, (client, messages, tools) in cases.items():
        with pytest.raises(openai.BadRequestError) as err:
            await chat(client, messages, **({"tools": tools} if tools else {}))
        code, header = expect[name]
        assert err.value.body["code"] == code and header in err.value.body["message"], name
    assert await summary(temporal_client, eid) == before
    # the summary call as an auxiliary call, then the summarised history without the rewrite header
    aux = oai(gateway_url, eid, **{"x-grove-call-kind": "auxiliary"})
    s, h = await chat(aux, [user("Summarise the conversation so far.")])
    assert h["x-grove-call-id"] == "parent~aux.0.c0"
    rewritten = [SYSTEM, user("Here is a summary of the conversation to date:\n\n" + (s["content"] or ""))]
    before = await delivered_summary(temporal_client, eid)
    with pytest.raises(openai.BadRequestError) as err:
        await chat(parent, rewritten, tools=TOOLS)
    error = err.value.body
    assert error["code"] == "UndeclaredRewriteError" and "x-grove-rewrite: 1" in error["message"]
    assert error["param"] == "messages[1].content"
    assert await summary(temporal_client, eid) == before
    _, h = await chat(oai(gateway_url, eid, **{"x-grove-rewrite": "1"}), rewritten, tools=TOOLS)
    assert h["x-grove-call-id"] == "parent.1.c0"


async def test_close_without_outputs_scores_each_agents_last_answer(gateway_url, temporal_client):  # noqa: F811
    """A close that lists no outputs: each agent answers its last selected response, as the harness
    received it (not an empty output)."""
    eid = await start(temporal_client, "outputs")
    parent = oai(gateway_url, eid)
    task = [SYSTEM, user("Delegate.")]
    p0, h = await chat(parent, task)
    worker = oai(
        gateway_url, eid, **{"x-grove-agent": "worker-1", "x-grove-spawned-by": h["x-grove-call-id"]}
    )
    w0, _ = await chat(worker, [SYSTEM, user("Part A.")])
    w1, _ = await chat(worker, [SYSTEM, user("Part A."), w0, user("Again.")])
    p1, _ = await chat(parent, [*task, p0, user("The worker answered.")])
    r = await close(gateway_url, eid, {"final_answer": "the end"}, wait=True)
    result = r.json()["result"]
    received = {"parent": [p1["content"] or ""], "worker-1": [w1["content"] or ""]}
    expected = scenario.score(scenario.make_task(0), HarnessOutcome(final_answer="the end", outputs=received))
    unfilled = scenario.score(scenario.make_task(0), HarnessOutcome(final_answer="the end"))
    assert result["status"] == "ok" and result["reward"] == expected.reward != unfilled.reward
