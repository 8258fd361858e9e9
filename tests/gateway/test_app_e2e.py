"""The capture gateway on real services: uvicorn on a free port, the real Temporal dev server, one grove
worker with a real vLLM engine on the tiny-random model, a local object store.

Harnesses are played by the `openai` Python client and raw httpx. What each call really was is read
from the engine (`recording_engine.served`: the prompt and sampled ids it served), never from the
gateway's own records, and what the episode admitted from the workflow's `summary` query.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import openai
import pytest
import uvicorn

from gateway.http.app import create_app
from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from gateway.http.settings import GatewaySettings
from grove import queues
from grove.contracts import EpisodeSpec, HarnessSpec
from grove.receipts import CallState, ContextOrigin
from grove.sampling import SamplingConfig
from harnesses import scenario
from ledger.accounting import LedgerSummary
from tests.bounds import SERVICE_TEST_TIMEOUT, STATE_WAIT
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

SECRET = "gateway-test-secret-0123456789"
MODEL = "grove-tiny"
SYSTEM = {"role": "system", "content": "You are a careful agent."}
MORE = {"role": "user", "content": "More."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]


# ---------------------------------------------------------------------------------------------- fixtures


@asynccontextmanager
async def serving(app) -> AsyncIterator[str]:
    """`app` served by uvicorn (lifespan on) on a free port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await until_serving(server, task)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def until_serving(server: uvicorn.Server, task: asyncio.Task, timeout: float = STATE_WAIT) -> None:
    """Until uvicorn serves (its lifespan started: Temporal client, store, tokenizer and context window
    loaded; the socket listening), a state that stays once reached; a startup failure is raised as is.
    Bounded as every state wait (tests/bounds.py): the startup's work scales with the machine's load (the
    bound was 10 s, after which the tests met a socket not listening yet or an app without its state)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (server.started or task.done()):
        assert asyncio.get_running_loop().time() < deadline, f"the gateway did not start in {timeout:.0f} s"
        await asyncio.sleep(0.05)
    if task.done():
        task.result()  # surface a startup failure (or a server that returned before serving)
        raise AssertionError("uvicorn returned before serving")


def gateway_settings(temporal_server, e2e_store, tiny_model_dir, recording_engine) -> GatewaySettings:
    """The gateway of these tests: the engine's model and context (so prompt lengths are its own)."""
    return GatewaySettings(
        temporal_address=temporal_server.address, store=str(e2e_store.root), secret=SECRET, model_name=MODEL,
        policy_model=str(tiny_model_dir), max_model_len=recording_engine.config.max_model_len,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def gateway_url(temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine):
    settings = gateway_settings(temporal_server, e2e_store, tiny_model_dir, recording_engine)
    async with serving(create_app(settings)) as url:
        yield url


async def start_episode(client, name: str, *, pinned: bool = False) -> str:
    """An external episode (id with '/') waiting for the gateway's calls and its close. Its id seeds its
    calls (activities/generate.call_seed): a fresh id per run draws fresh replies, which these checks
    take whatever they are; `pinned` fixes it (`gw-{name}`: one episode of that name per session) for a
    test whose checks hold for the replies its fixed requests draw, not for every possible reply."""
    run = f"gw-{name}" if pinned else f"gw-{name}-{uuid.uuid4().hex[:6]}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8),
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


def base_url(url: str, episode_id: str) -> str:
    return f"{url}/episodes/{episode_ref(episode_id)}/v1"


def oai(url: str, episode_id: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url(url, episode_id),
        api_key=issue_token(SECRET, episode_id),
        max_retries=0,
        default_headers=headers or None,
    )


def http(url: str, episode_id: str) -> httpx.AsyncClient:
    token = issue_token(SECRET, episode_id)
    return httpx.AsyncClient(
        base_url=base_url(url, episode_id), headers={"authorization": f"Bearer {token}"}, timeout=120
    )


async def close(url: str, episode_id: str, request: dict, *, wait: bool) -> httpx.Response:
    """The management route (beside /v1, not under it)."""
    token = issue_token(SECRET, episode_id)
    async with httpx.AsyncClient(timeout=120) as c:
        return await c.post(
            f"{url}/episodes/{episode_ref(episode_id)}/close",
            params={"wait": str(wait).lower()},
            json=request,
            headers={"authorization": f"Bearer {token}"},
        )


async def summary(client, episode_id: str) -> LedgerSummary:
    return await client.get_workflow_handle(episode_id).query("summary", result_type=LedgerSummary)


async def delivered_summary(client, episode_id: str) -> LedgerSummary:
    """The summary once every response a client got is recorded delivered. The gateway records a delivery
    after the response's last part went out (gateway/pipeline/delivery.py), so a client holds its answer
    a moment before the ledger counts it; once recorded it stays so (a state that stays once reached)."""
    deadline = time.monotonic() + STATE_WAIT
    while True:
        s = await summary(client, episode_id)
        if not any(c.awaiting_delivery for c in s.contexts):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(
                f"episode {episode_id!r}: deliveries still awaited after {STATE_WAIT} s: {s}"
            )
        await asyncio.sleep(0.05)


def contexts(s: LedgerSummary) -> dict:
    return {c.context_id: c for c in s.contexts}


def body(messages: list, **extra) -> dict:
    return {"model": MODEL, "messages": messages, **extra}


def assistant_of(choice_message) -> dict:
    """The assistant message as a harness echoes it back."""
    msg = {"role": "assistant", "content": choice_message.content}
    if choice_message.tool_calls:
        msg["tool_calls"] = [c.model_dump() for c in choice_message.tool_calls]
    return msg


def starts_with(prompt: np.ndarray, prefix: np.ndarray) -> bool:
    return prompt.size > prefix.size and np.array_equal(prompt[: prefix.size], prefix)


def extension_of(engine, episode_id: str, child: str, parent: str) -> bool:
    served = engine.calls_of(episode_id)
    p = served[parent]
    return starts_with(served[child].prompt_ids, np.concatenate([p.prompt_ids, p.completion_ids]))


def sse_chunks(lines: list[str]) -> tuple[list[dict], list[str]]:
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [json.loads(d) for d in data if d != "[DONE]"], data


# ---------------------------------------------------------------------------------------------- tests


async def test_healthz_needs_no_auth(gateway_url):
    async with httpx.AsyncClient() as c:
        r = await c.get(f"{gateway_url}/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_models_lists_the_served_model(gateway_url, temporal_client):
    eid = "gw-models/s000001/t0/g0"  # no workflow needed: /models reaches none
    client = oai(gateway_url, eid)
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as err:
        await client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "UnknownModelError"


async def test_non_streaming_completion_reports_the_served_tokens(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "plain")
    client = oai(gateway_url, eid)
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[SYSTEM, {"role": "user", "content": "Say hello."}],
        max_tokens=6,
        temperature=0.8,
    )
    resp = raw.parse()
    call_id = raw.headers["x-grove-call-id"]
    assert call_id == "parent.0.c0" and raw.headers["x-grove-context"] == "parent.0"
    served = recording_engine.calls_of(eid)[call_id]
    assert resp.object == "chat.completion" and resp.model == MODEL
    assert resp.usage.prompt_tokens == served.prompt_ids.size
    assert resp.usage.completion_tokens == served.completion_ids.size <= 6
    assert resp.usage.total_tokens == served.prompt_ids.size + served.completion_ids.size
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content is not None
    s = await summary(temporal_client, eid)
    assert s.totals[CallState.COMPLETED] == 1 and contexts(s)["parent.0"].origin == ContextOrigin.ROOT


async def test_streaming_sends_chunks_usage_then_done(gateway_url, temporal_client, recording_engine):
    eid = await start_episode(temporal_client, "stream")
    request = body([SYSTEM, {"role": "user", "content": "Stream it."}], stream=True)
    request["stream_options"] = {"include_usage": True}
    async with http(gateway_url, eid) as c, c.stream("POST", "/chat/completions", json=request) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in r.aiter_lines()]
    chunks, data = sse_chunks(lines)
    assert data[-1] == "[DONE]"
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    usage = chunks[-1]
    assert usage["choices"] == []
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    assert usage["usage"] == {
        "prompt_tokens": served.prompt_ids.size,
        "completion_tokens": served.completion_ids.size,
        "total_tokens": served.prompt_ids.size + served.completion_ids.size,
    }
    # through the openai client's stream parser (another agent: a new context), without a usage chunk
    client = oai(gateway_url, eid, **{"x-grove-agent": "second"})
    streamed = await client.chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Again."}], stream=True
    )
    parts = [ch async for ch in streamed]
    assert all(ch.usage is None for ch in parts) and parts[-1].choices[0].finish_reason in ("stop", "length")


async def test_multi_turn_continues_exactly_and_close_publishes_rows(
    gateway_url, temporal_client, recording_engine, e2e_store
):
    eid = await start_episode(temporal_client, "turns")
    client = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "Count to three."}]
    first = await client.chat.completions.create(model=MODEL, messages=messages)
    messages += [assistant_of(first.choices[0].message), {"role": "user", "content": "Go on."}]
    second = await client.chat.completions.create(model=MODEL, messages=messages, stream=True)
    reply = "".join([ch.choices[0].delta.content or "" async for ch in second if ch.choices])
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Done?"}]
    await client.chat.completions.create(model=MODEL, messages=messages)

    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
    assert extension_of(recording_engine, eid, "parent.0.c2", "parent.0.c1")
    s = await summary(temporal_client, eid)
    assert contexts(s)["parent.0"].head == "parent.0.c2" and s.totals[CallState.COMPLETED] == 3

    r = await close(gateway_url, eid, {"final_answer": reply}, wait=True)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 3}
    rows = rows_from_parquet(e2e_store.get(result["rows_key"]))
    served = recording_engine.calls_of(eid)
    [row] = rows
    assert [s.call_id for s in row.spans] == ["parent.0.c0", "parent.0.c1", "parent.0.c2"]
    last = served["parent.0.c2"]
    np.testing.assert_array_equal(row.input_ids, np.concatenate([last.prompt_ids, last.completion_ids]))
    assert not e2e_store.list(f"staging/{eid}/")  # chat records went with the staging area


async def test_tool_call_arguments_reserialised_compact_still_continue(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "tools")
    client = oai(gateway_url, eid)
    call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{\n  "path": "notes.txt",\n  "limit": 10\n}'},
    }
    messages = [
        SYSTEM,
        {"role": "user", "content": "Read notes.txt."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "line 1\nline 2"},
    ]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    compact = {**call, "function": {"name": "read_file", "arguments": '{"path":"notes.txt","limit":10}'}}
    again = [*messages[:2], {**messages[2], "tool_calls": [compact]}, messages[3]]
    again += [assistant_of(first.choices[0].message), {"role": "user", "content": "Summarise it."}]
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=again, tools=TOOLS)
    assert raw.headers["x-grove-call-id"] == "parent.0.c1"
    assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
    # a different argument value is not a re-serialisation: refused, nothing admitted
    edited = {**call, "function": {"name": "read_file", "arguments": '{"path":"other.txt","limit":10}'}}
    bad = [*messages[:2], {**messages[2], "tool_calls": [edited]}, *again[3:]]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=bad, tools=TOOLS)
    assert err.value.body["param"] == "messages[2].tool_calls"
    s = await summary(temporal_client, eid)
    assert sum(s.totals.values()) == 2


async def test_resent_request_discards_the_head_and_extends_its_parent(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "retry")
    client = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "Hi."}]
    first = await client.chat.completions.create(model=MODEL, messages=messages)
    turn2 = [*messages, assistant_of(first.choices[0].message), {"role": "user", "content": "More."}]
    await client.chat.completions.create(model=MODEL, messages=turn2)
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=turn2)  # a resample
    assert raw.headers["x-grove-call-id"] == "parent.0.c2"
    s = contexts(await summary(temporal_client, eid))["parent.0"]
    assert s.head == "parent.0.c2" and s.counts[CallState.DISCARDED] == 1
    assert extension_of(recording_engine, eid, "parent.0.c2", "parent.0.c0")


async def test_undelivered_head_is_discarded_when_the_harness_retries(
    gateway_url, temporal_client, recording_engine, e2e_store
):
    """A call whose chat record is missing never reached the harness (the gateway died after the call
    and before answering); the harness's retry must not be refused because of it."""
    eid = await start_episode(temporal_client, "undelivered")
    client = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "Hi."}]
    await client.chat.completions.create(model=MODEL, messages=messages)
    e2e_store.delete(f"staging/{eid}/parent.0.c0.chat.json")
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert raw.headers["x-grove-call-id"] == "parent.0.c1"
    s = contexts(await summary(temporal_client, eid))["parent.0"]
    assert s.counts[CallState.DISCARDED] == 1 and s.head == "parent.0.c1"


async def test_worker_context_spawned_via_headers(gateway_url, temporal_client, recording_engine):
    eid = await start_episode(temporal_client, "spawn")
    parent = oai(gateway_url, eid)
    raw = await parent.chat.completions.with_raw_response.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Delegate."}]
    )
    spawner = raw.headers["x-grove-call-id"]
    w1 = oai(gateway_url, eid, **{"x-grove-agent": "worker-1", "x-grove-spawned-by": spawner})
    w2 = oai(gateway_url, eid, **{"x-grove-agent": "worker-2", "x-grove-parent-context": "parent.0"})
    worker_msgs = [SYSTEM, {"role": "user", "content": "Do part A."}]
    a, b = await asyncio.gather(
        w1.chat.completions.with_raw_response.create(model=MODEL, messages=worker_msgs),
        w2.chat.completions.with_raw_response.create(model=MODEL, messages=worker_msgs),
    )
    assert (a.headers["x-grove-call-id"], b.headers["x-grove-call-id"]) == ("worker-1.0.c0", "worker-2.0.c0")
    # worker-1's second turn continues its own context, not the parent's
    reply = assistant_of(a.parse().choices[0].message)
    await w1.chat.completions.create(
        model=MODEL, messages=[*worker_msgs, reply, {"role": "user", "content": "Finish."}]
    )
    assert extension_of(recording_engine, eid, "worker-1.0.c1", "worker-1.0.c0")
    ctx = contexts(await summary(temporal_client, eid))
    assert ctx["worker-1.0"].origin == ctx["worker-2.0"].origin == ContextOrigin.SPAWN
    assert ctx["worker-1.0"].agent == "worker-1" and ctx["worker-1.0"].head == "worker-1.0.c1"
    # a spawner that does not exist is refused before anything is opened
    w3 = oai(gateway_url, eid, **{"x-grove-agent": "worker-3", "x-grove-parent-context": "nope.0"})
    with pytest.raises(openai.BadRequestError) as err:
        await w3.chat.completions.create(model=MODEL, messages=worker_msgs)
    assert err.value.body["code"] == "RoutingError"
    # a spawning call the ledger never admitted: the workflow's validator refuses the reservation
    w4 = oai(gateway_url, eid, **{"x-grove-agent": "worker-4", "x-grove-spawned-by": "parent.0.c9"})
    with pytest.raises(openai.BadRequestError) as err:
        await w4.chat.completions.create(model=MODEL, messages=worker_msgs)
    assert err.value.body["code"] == "UnknownCallError" and "parent.0.c9" in err.value.body["message"]
    assert not {"worker-3.0", "worker-4.0"} & set(contexts(await summary(temporal_client, eid)))


async def test_declared_rewrite_and_auxiliary_calls_get_contexts_of_their_own(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "rewrite")
    client = oai(gateway_url, eid)
    first = await client.chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Long task."}]
    )
    aux = oai(gateway_url, eid, **{"x-grove-call-kind": "auxiliary"})
    raw = await aux.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Summarise: long task."}]
    )
    assert (raw.headers["x-grove-agent"], raw.headers["x-grove-call-id"]) == ("parent~aux", "parent~aux.0.c0")
    rewritten = [SYSTEM, {"role": "user", "content": "Summary: a long task. Continue."}]
    rewrite = oai(gateway_url, eid, **{"x-grove-rewrite": "1"})
    raw = await rewrite.chat.completions.with_raw_response.create(model=MODEL, messages=rewritten)
    assert raw.headers["x-grove-call-id"] == "parent.1.c0"
    # the next turn continues the new context, without any header
    turn = [*rewritten, assistant_of(raw.parse().choices[0].message), {"role": "user", "content": "Next."}]
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=turn)
    assert raw.headers["x-grove-call-id"] == "parent.1.c1"
    assert extension_of(recording_engine, eid, "parent.1.c1", "parent.1.c0")
    before = await delivered_summary(temporal_client, eid)
    ctx = contexts(before)
    assert ctx["parent.0"].retired_by == "parent.1" and ctx["parent.1"].origin == ContextOrigin.REWRITE
    # continuing the retired context by name: the ledger refuses it (409, its own message), admits nothing
    stale = oai(gateway_url, eid, **{"x-grove-context": "parent.0"})
    old = [SYSTEM, {"role": "user", "content": "Long task."}, assistant_of(first.choices[0].message), MORE]
    with pytest.raises(openai.ConflictError) as err:
        await stale.chat.completions.create(model=MODEL, messages=old)
    assert (
        err.value.body["code"] == "StaleContinuationError"
        and "retired by rewrite" in err.value.body["message"]
    )
    assert await summary(temporal_client, eid) == before
    r = await close(gateway_url, eid, {}, wait=True)
    assert r.json()["result"]["counts"] == {"selected": 3, "auxiliary": 1}


async def opencode_call(c: httpx.AsyncClient, messages, headers, tools=None) -> tuple[dict, dict, dict]:
    """One OpenCode-style request (streamed, with usage); returns (assistant message, usage, headers)."""
    request = body(messages, stream=True, stream_options={"include_usage": True}, max_tokens=8)
    if tools:
        request |= {"tools": tools, "tool_choice": "auto"}
    async with c.stream("POST", "/chat/completions", json=request, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        chunks, _ = sse_chunks([line async for line in r.aiter_lines()])
        grove = {k: v for k, v in r.headers.items() if k.startswith("x-grove-")}
    content = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    return {"role": "assistant", "content": content}, chunks[-1]["usage"], grove


async def test_opencode_sessions_title_subagent_and_compaction(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "opencode")
    root, child = (
        {"x-session-id": "ses_root1"},
        {"x-session-id": "ses_kid1", "x-parent-session-id": "ses_root1"},
    )
    async with http(gateway_url, eid) as c:
        title = [
            {"role": "system", "content": "You are a title generator. Output a title."},
            {"role": "user", "content": "fix bug"},
        ]
        _, _, h = await opencode_call(c, title, root)
        assert (h["x-grove-agent"], h["x-grove-call-id"]) == ("parent~title", "parent~title.0.c0")

        history = [SYSTEM, {"role": "user", "content": "fix bug"}]
        reply, usage, h = await opencode_call(c, history, root, TOOLS)
        assert h["x-grove-call-id"] == "parent.0.c0"
        served = recording_engine.calls_of(eid)["parent.0.c0"]
        assert usage["prompt_tokens"] == served.prompt_ids.size  # OpenCode's compaction trigger is real

        kid = [SYSTEM, {"role": "user", "content": "look at the parser"}]
        kid_reply, _, h = await opencode_call(c, kid, child, TOOLS)
        assert h["x-grove-call-id"] == "worker-ses_kid1.0.c0"

        task_result = (
            '<task id="ses_kid1" state="completed"><task_result>'
            + kid_reply["content"]
            + "</task_result></task>"
        )
        history += [reply, {"role": "user", "content": task_result}]
        reply, _, h = await opencode_call(c, history, root, TOOLS)
        assert h["x-grove-call-id"] == "parent.0.c1"
        assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")

        flat = "\n".join(json.dumps(m) for m in history)
        summarize = [
            {"role": "system", "content": "You are a context summarization agent. Summarize."},
            {"role": "user", "content": flat},
        ]
        summary_msg, _, h = await opencode_call(c, summarize, root)
        assert h["x-grove-agent"] == "parent~summary"

        compacted = [
            SYSTEM,
            {"role": "user", "content": "What did we do so far?"},
            {"role": "assistant", "content": summary_msg["content"]},
            {
                "role": "user",
                "content": "Continue if you have next steps, or stop and ask for clarification.",
            },
        ]
        after, _, h = await opencode_call(c, compacted, root, TOOLS)
        assert h["x-grove-call-id"] == "parent.1.c0"  # a declared rewrite: new context, a root
        _, _, h = await opencode_call(c, [*compacted, after, {"role": "user", "content": "ok"}], root, TOOLS)
        assert h["x-grove-call-id"] == "parent.1.c1"
        assert extension_of(recording_engine, eid, "parent.1.c1", "parent.1.c0")

        # a second title call in the same auxiliary agent: a context of its own again
        _, _, h = await opencode_call(c, [title[0], {"role": "user", "content": "other"}], root)
        assert h["x-grove-call-id"] == "parent~title.1.c0"

    ctx = contexts(await summary(temporal_client, eid))
    assert ctx["parent.0"].retired_by == "parent.1" and ctx["parent.1"].origin == ContextOrigin.REWRITE
    assert ctx["worker-ses_kid1.0"].origin == ContextOrigin.SPAWN
    r = await close(gateway_url, eid, {}, wait=True)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["counts"] == {"selected": 5, "auxiliary": 3}


async def test_undeclared_edit_is_refused_naming_the_message(gateway_url, temporal_client):
    eid = await start_episode(temporal_client, "edit")
    client = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "Plan the trip."}]
    first = await client.chat.completions.create(model=MODEL, messages=messages)
    before = await delivered_summary(temporal_client, eid)
    edited = [
        SYSTEM,
        {"role": "user", "content": "Plan the holiday."},
        assistant_of(first.choices[0].message),
    ]
    edited.append({"role": "user", "content": "And?"})
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=edited)
    error = err.value.body
    assert error["code"] == "UndeclaredDiscontinuityError" and error["param"] == "messages[1].content"
    assert "message 1" in error["message"] and "declare a rewrite" in error["message"]
    assert await summary(temporal_client, eid) == before


async def test_auth_refusals_reach_no_workflow(gateway_url, temporal_client):
    eid = await start_episode(temporal_client, "auth")
    other = "gw-someone-else/s000001/t0/g0"
    before = await delivered_summary(temporal_client, eid)
    request = body([SYSTEM, {"role": "user", "content": "hi"}])
    url = f"{base_url(gateway_url, eid)}/chat/completions"
    async with httpx.AsyncClient() as c:
        missing = await c.post(url, json=request)
        malformed = await c.post(url, json=request, headers={"authorization": "Bearer sk-not-a-grove-token"})
        foreign = await c.post(
            url, json=request, headers={"authorization": f"Bearer {issue_token(SECRET, other)}"}
        )
        forged = await c.post(
            url, json=request, headers={"authorization": f"Bearer {issue_token('x' * 20, eid)}"}
        )
        # auth is decided before any lookup: an episode that does not exist still answers 401, not 404
        ghost = await c.post(f"{base_url(gateway_url, 'no/such/episode')}/chat/completions", json=request)
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "MissingTokenError")
    assert (malformed.status_code, malformed.json()["error"]["code"]) == (401, "MalformedTokenError")
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "WrongEpisodeTokenError")
    assert forged.status_code == 403 and ghost.status_code == 401
    assert await summary(temporal_client, eid) == before


async def test_bad_requests_get_openai_errors_and_admit_nothing(gateway_url, temporal_client):
    eid = await start_episode(temporal_client, "bad")
    before = await delivered_summary(temporal_client, eid)
    ok = [SYSTEM, {"role": "user", "content": "hi"}]
    async with http(gateway_url, eid) as c:
        cases = {
            "bad json": await c.post("/chat/completions", content=b"{not json"),
            "no messages": await c.post("/chat/completions", json={"model": MODEL}),
            "unknown model": await c.post("/chat/completions", json={"model": "gpt-4o", "messages": ok}),
            "n=2": await c.post("/chat/completions", json=body(ok, n=2)),
            "logit_bias": await c.post("/chat/completions", json=body(ok, logit_bias={"5": 10})),
            "penalty": await c.post("/chat/completions", json=body(ok, presence_penalty=0.5)),
            "top_k": await c.post("/chat/completions", json=body(ok, top_k=5)),
            "greedy": await c.post("/chat/completions", json=body(ok, temperature=0)),
            "role": await c.post("/chat/completions", json=body([{"role": "wizard", "content": "x"}])),
            "header": await c.post("/chat/completions", json=body(ok), headers={"x-grove-spawned-by": "a/b"}),
            "no route": await c.get("/nowhere"),
        }
        not_found = await c.post(
            f"{base_url(gateway_url, 'no/such/ep')}/chat/completions",
            json=body(ok),
            headers={"authorization": f"Bearer {issue_token(SECRET, 'no/such/ep')}"},
        )
    expect = {
        "bad json": (400, "InvalidChatRequestError", None),
        "no messages": (400, "InvalidChatRequestError", "messages"),
        "unknown model": (404, "UnknownModelError", "model"),
        "n=2": (400, "UnsupportedParameterError", "n"),
        "logit_bias": (400, "UnsupportedParameterError", "logit_bias"),
        "penalty": (400, "UnsupportedParameterError", "presence_penalty"),
        "top_k": (400, "UnsupportedParameterError", "top_k"),
        "greedy": (400, "InvalidSamplingError", "temperature"),
        "role": (400, "InvalidChatRequestError", "messages[0].role"),
        "header": (400, "InvalidIdentityHeaderError", None),
        "no route": (404, "HTTP404", None),
    }
    for name, response in cases.items():
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["param"]) == expect[name], name
        assert "Traceback" not in response.text and error["message"]
    assert not_found.status_code == 404 and not_found.json()["error"]["code"] == "EpisodeNotFoundError"
    assert await summary(temporal_client, eid) == before


async def test_requests_after_close_are_refused_by_the_workflow(gateway_url, temporal_client):
    eid = await start_episode(temporal_client, "closed")
    client = oai(gateway_url, eid)
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    await client.chat.completions.create(model=MODEL, messages=messages)
    r = await close(gateway_url, eid, {"final_answer": "x"}, wait=False)
    assert r.status_code == 200 and r.json()["result"] is None
    await temporal_client.get_workflow_handle(eid).result()
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(
            model=MODEL, messages=[SYSTEM, {"role": "user", "content": "again"}]
        )
    assert (err.value.status_code, err.value.body["code"]) == (409, "EpisodeClosedError")
