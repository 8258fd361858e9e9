"""The Responses API (`POST /episodes/{ref}/v1/responses`, Codex CLI's wire format) on real services:
uvicorn serving the real gateway app, the real Temporal dev server, one grove worker with a vLLM engine on
the tiny-random model, a local object store. Requests are shaped like the ones stock Codex 0.171.0 sends
(models/harness_text/codex_0_171_0.json): a developer message, tools of type function, namespace and
custom, `store: false`, `include`, `reasoning`, `prompt_cache_key`.

What each call really was is read from the engine (`recording_engine`), what the episode admitted from
its `summary` query, and the answers through the `openai` client's own Responses types.
"""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from gateway.http.app import create_app
from gateway.intake.previous_response import response_id
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import (
    MODEL,
    close,
    contexts,
    delivered_summary,
    extension_of,
    gateway_settings,
    http,
    oai,
    serving,
    start_episode,
    summary,
)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


@pytest.fixture(scope="module")
async def gateway_url(temporal_server, grove_worker, e2e_store, tiny_model_dir, recording_engine):
    settings = gateway_settings(temporal_server, e2e_store, tiny_model_dir, recording_engine)
    async with serving(create_app(settings)) as url:
        yield url


DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files; FREEFORM.",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Subagents.", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn an agent.", "strict": False,
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}},
    ]},
]  # fmt: skip
CODEX_FIELDS = {
    "tool_choice": "auto", "parallel_tool_calls": True, "store": False,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "01a2503a-0000",
    "reasoning": {"effort": "medium"}, "text": {"verbosity": "low"},
}  # fmt: skip


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def responses_body(items: list, **extra) -> dict:
    return {"model": MODEL, "input": items, "tools": TOOLS, "max_output_tokens": 8, **CODEX_FIELDS, **extra}


HISTORY = [  # a lead that already spawned a subagent and patched a file (its own earlier turns)
    DEVELOPER,
    user("Delegate the word apple."),
    {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_1", "name": "spawn_agent",
     "namespace": "multi_agent_v1", "arguments": '{"message": "Say apple"}'},
    {"type": "function_call_output", "id": "fco_1", "call_id": "call_1",
     "output": '{"agent_id":"01a2","nickname":"Euler"}'},
    {"type": "custom_tool_call", "id": "ctc_2", "status": "completed", "call_id": "call_2",
     "name": "apply_patch", "input": "*** Begin Patch\n*** Add File: a.txt\n+apple\n*** End Patch\n"},
    {"type": "custom_tool_call_output", "id": "ctco_2", "call_id": "call_2", "output": "Success."},
]  # fmt: skip


async def test_a_streamed_answer_is_the_responses_event_sequence(
    gateway_url, temporal_client, recording_engine
):
    eid = await start_episode(temporal_client, "responses-stream")
    client = oai(gateway_url, eid)
    stream = await client.responses.create(**responses_body([DEVELOPER, user("Say hi.")]), stream=True)
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    final = events[-1].response
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    # the tiny-random model rarely ends a turn within its 8 tokens: a cut turn's message says so
    assert final.status == "completed"
    cut = served.completion_ids.size == 8 and final.output[0].status == "incomplete"
    assert cut or final.output[0].status == "completed"
    assert types[-2:] == ["response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage.input_tokens == served.prompt_ids.size
    assert final.usage.output_tokens == served.completion_ids.size
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output[0].type == "message" and final.output[0].content[0].text == text
    s = await delivered_summary(temporal_client, eid)
    assert contexts(s)["parent.0"].head == "parent.0.c0"


async def test_a_json_answer_and_its_call_headers(gateway_url, temporal_client, recording_engine):
    eid = await start_episode(temporal_client, "responses-json")
    async with http(gateway_url, eid) as c:
        r = await c.post("/responses", json=responses_body([DEVELOPER, user("Say hi.")], stream=False))
    assert r.status_code == 200, r.text
    assert r.headers["x-grove-call-id"] == "parent.0.c0" and r.headers["x-grove-agent"] == "parent"
    answer = r.json()
    assert answer["object"] == "response" and answer["status"] in ("completed", "incomplete")
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    assert answer["usage"]["input_tokens"] == served.prompt_ids.size
    assert answer["usage"]["output_tokens"] == served.completion_ids.size


async def test_a_tool_call_history_is_spliced_exactly(
    gateway_url, temporal_client, recording_engine, e2e_store
):
    """The second request is the first's input, the first's output items as returned, and a new user message:
    it continues the first call's exact tokens. An edited history is refused and admits nothing."""
    eid = await start_episode(temporal_client, "responses-splice")
    async with http(gateway_url, eid) as c:
        r = await c.post("/responses", json=responses_body(HISTORY, stream=False))
        assert r.status_code == 200, r.text
        returned = r.json()["output"]
        following = [*HISTORY, *returned, user("Now answer.")]
        r2 = await c.post("/responses", json=responses_body(following, stream=False))
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-grove-call-id"] == "parent.0.c1"
        assert extension_of(recording_engine, eid, "parent.0.c1", "parent.0.c0")
        s = await delivered_summary(temporal_client, eid)
        before = sum(s.totals.values())
        edited_patch = [
            *HISTORY[:4],
            {**HISTORY[4], "input": "*** Begin Patch\n*** End Patch\n"},
            *following[5:],
        ]
        edited_call = [*HISTORY[:2], {**HISTORY[2], "arguments": '{"message": "Say pear"}'}, *following[3:]]
        for edited, item in ((edited_patch, 4), (edited_call, 2)):
            r3 = await c.post("/responses", json=responses_body(edited, stream=False))
            assert r3.status_code == 400, r3.text
            error = r3.json()["error"]
            assert error["code"] == "UndeclaredDiscontinuityError" and error["param"] == f"input[{item}]"
        assert sum((await summary(temporal_client, eid)).totals.values()) == before
    r = await close(gateway_url, eid, {"final_answer": "apple"}, wait=True)
    assert r.status_code == 200, r.text
    [row] = rows_from_parquet(e2e_store.get(r.json()["result"]["rows_key"]))
    last = recording_engine.calls_of(eid)["parent.0.c1"]
    np.testing.assert_array_equal(row.input_ids, np.concatenate([last.prompt_ids, last.completion_ids]))


BAD = [  # (input items or body update, status, code, param)
    ([DEVELOPER, user("x"), {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}], 400,
     "UnsupportedInputItemError", "input[2].type"),
    ([DEVELOPER, user("x"), {"type": "web_search_call", "id": "ws_1", "status": "completed"}], 400,
     "UnsupportedInputItemError", "input[2].type"),
    ([DEVELOPER, user("x"), {"type": "function_call_output", "call_id": "call_9", "output": "x"}], 400,
     "UnmatchedToolOutputError", "input[2].call_id"),
    ([*HISTORY[:3], {"type": "custom_tool_call_output", "call_id": "call_1", "output": "x"}], 400,
     "MismatchedToolOutputError", "input[3].type"),
    ([*HISTORY[:3], {**HISTORY[2], "name": "exec_command", "namespace": None}], 400,
     "DuplicateCallIdError", "input[3].call_id"),
    ({"tools": [*TOOLS, {"type": "web_search"}]}, 400, "UnsupportedToolError", "tools[3].type"),
    ({"previous_response_id": "resp_1"}, 400, "MalformedResponseIdError", "previous_response_id"),
    ({"conversation": "conv_1"}, 400, "ConversationNotServedError", "conversation"),
    ({"tool_choice": "required"}, 400, "UnsupportedParameterError", "tool_choice"),
    ({"model": "gpt-6"}, 404, "UnknownModelError", "model"),
]  # fmt: skip


async def test_bad_requests_are_refused_in_the_responses_error_shape_and_admit_nothing(
    gateway_url, temporal_client
):
    eid = await start_episode(temporal_client, "responses-bad")
    async with http(gateway_url, eid) as c:
        for case, status, code, param in BAD:
            request = (
                responses_body(case) if isinstance(case, list) else {**responses_body([user("x")]), **case}
            )
            r = await c.post("/responses", json=request)
            assert r.status_code == status, r.text
            error = r.json()["error"]
            assert (error["code"], error["param"]) == (code, param), error
            assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
            assert error["message"]
    s = await summary(temporal_client, eid)
    assert s.contexts == [] and sum(s.totals.values()) == 0
    client = oai(gateway_url, eid)
    with pytest.raises(openai.BadRequestError) as err:  # the openai client reads the error as OpenAI's
        await client.responses.create(
            **responses_body([user("x"), {"type": "item_reference", "id": "msg_1"}])
        )
    assert err.value.code == "UnsupportedInputItemError"
    assert json.dumps(err.value.body).count("item_reference") >= 1


# Near-greedy sampling (the top token only): two episodes whose calls have different seeds draw the same
# replies to the same prompts, so that the chained and the whole-history episode can be compared token for
# token. A difference in what the gateway builds changes the prompt, which no sampling can hide.
GREEDY = {"temperature": 0.01, "top_p": 1e-6}
TURNS = [[DEVELOPER, user("Say one.")], [user("Say two.")], [user("Say three.")]]


async def test_previous_response_id_chains_exactly_like_the_whole_history(
    gateway_url, temporal_server, temporal_client, e2e_store, tiny_model_dir, recording_engine
):
    """Three requests, each naming the last response's id and sending only its new message, give the calls,
    tokens and rows of the same conversation sent whole (Codex's way); the third request goes to another
    gateway on the same store and Temporal (a relaunched gateway reads the record, not its memory). An id of
    no recorded call, of another episode or not the gateway's is a 400 naming it, and admits nothing."""
    chained = await start_episode(temporal_client, "responses-chain")
    whole = await start_episode(temporal_client, "responses-whole")
    answers = []
    async with http(gateway_url, chained) as c:
        for items in TURNS[:2]:
            extra = {"previous_response_id": answers[-1]["id"]} if answers else {}
            r = await c.post("/responses", json=responses_body(items, stream=False, **GREEDY, **extra))
            assert r.status_code == 200, r.text
            answers.append(r.json())
    await delivered_summary(temporal_client, chained)  # the first gateway is done with the episode
    settings = gateway_settings(temporal_server, e2e_store, tiny_model_dir, recording_engine)
    async with serving(create_app(settings)) as relaunched, http(relaunched, chained) as c:
        body = responses_body(TURNS[2], stream=False, previous_response_id=answers[-1]["id"], **GREEDY)
        r = await c.post("/responses", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-grove-call-id"] == "parent.0.c2"
    history: list = []
    async with http(gateway_url, whole) as c:
        for items in TURNS:
            history += items
            r = await c.post("/responses", json=responses_body(history, stream=False, **GREEDY))
            assert r.status_code == 200, r.text
            history += r.json()["output"]
    a, b = recording_engine.calls_of(chained), recording_engine.calls_of(whole)
    assert sorted(a) == sorted(b) == ["parent.0.c0", "parent.0.c1", "parent.0.c2"]
    for call in a:
        np.testing.assert_array_equal(a[call].prompt_ids, b[call].prompt_ids)
        np.testing.assert_array_equal(a[call].completion_ids, b[call].completion_ids)
    assert extension_of(recording_engine, chained, "parent.0.c1", "parent.0.c0")
    assert extension_of(recording_engine, chained, "parent.0.c2", "parent.0.c1")

    s = await delivered_summary(temporal_client, chained)
    before = sum(s.totals.values())
    refused = ((response_id(chained, "parent.0.c9"), "UnknownResponseIdError"),
               (answers[0]["id"].replace("resp_", "resp_!"), "MalformedResponseIdError"),
               (response_id(whole, "parent.0.c2"), "ForeignResponseIdError"))  # fmt: skip
    async with http(gateway_url, chained) as c:
        for rid, code in refused:
            body = responses_body(TURNS[1], stream=True, previous_response_id=rid)
            r = await c.post("/responses", json=body)
            assert r.status_code == 400, r.text  # a JSON error, before any event
            error = r.json()["error"]
            assert (error["code"], error["param"]) == (code, "previous_response_id"), error
            assert rid in error["message"] and "whole history" in error["message"]
    assert sum((await summary(temporal_client, chained)).totals.values()) == before

    rows = []
    for eid in (chained, whole):
        r = await close(gateway_url, eid, {"final_answer": "three"}, wait=True)
        assert r.status_code == 200, r.text
        [row] = rows_from_parquet(e2e_store.get(r.json()["result"]["rows_key"]))
        rows.append(row)
    last = a["parent.0.c2"]
    np.testing.assert_array_equal(rows[0].input_ids, np.concatenate([last.prompt_ids, last.completion_ids]))
    np.testing.assert_array_equal(rows[0].input_ids, rows[1].input_ids)
    np.testing.assert_array_equal(rows[0].loss_mask, rows[1].loss_mask)
    assert rows[0].spans == rows[1].spans and [s.call_id for s in rows[0].spans] == sorted(a)


def codex_meta(thread: str, *, parent: str | None = None, kind: str = "turn", window: int = 0) -> dict:
    """Codex's `x-codex-turn-metadata` header (the fields gateway/pipeline/codex.py reads, as Codex sends)."""
    meta = {
        "session_id": "lead-thread", "thread_id": thread, "window_number": window, "request_kind": kind,
        "thread_source": "subagent" if parent else "user", "agent_name": "/root",
    }  # fmt: skip
    if parent is not None:
        meta["parent_thread_id"] = parent
    return {"x-codex-turn-metadata": json.dumps(meta)}


async def test_codex_threads_are_agents_and_a_compaction_is_a_summary_then_a_rewrite(
    gateway_url, temporal_client
):
    """A lead thread, a subagent thread it spawned, the lead's compaction request (no tools) and the
    first turn of its next window, identified from Codex's turn metadata alone."""
    eid = await start_episode(temporal_client, "responses-codex-identity")
    task = [DEVELOPER, user("Delegate the word apple.")]
    async with http(gateway_url, eid) as c:
        r0 = await c.post(
            "/responses", json=responses_body(task, stream=False), headers=codex_meta("lead-thread")
        )
        assert r0.status_code == 200, r0.text
        assert r0.headers["x-grove-call-id"] == "parent.0.c0"
        sub = [DEVELOPER, user("Say apple.")]
        r1 = await c.post(
            "/responses",
            json=responses_body(sub, stream=False),
            headers=codex_meta("sub-1", parent="lead-thread"),
        )
        assert r1.status_code == 200, r1.text
        assert r1.headers["x-grove-context"] == "worker-sub-1.0"  # no spawn_agent call named it
        checkpoint = [
            *task,
            *r0.json()["output"],
            user("You are performing a CONTEXT CHECKPOINT COMPACTION."),
        ]
        r2 = await c.post(
            "/responses", json=responses_body(checkpoint, stream=False, tools=[]),
            headers=codex_meta("lead-thread", kind="compaction"),
        )  # fmt: skip
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-grove-agent"] == "parent~summary"
        summary_text = r2.json()["output"][0]["content"][0]["text"]
        window = [*task, user(f"Another language model started to solve this problem: {summary_text}")]
        r3 = await c.post(
            "/responses",
            json=responses_body(window, stream=False),
            headers=codex_meta("lead-thread", window=1),
        )
        assert r3.status_code == 200, r3.text
        assert r3.headers["x-grove-context"] == "parent.1"
    s = contexts(await delivered_summary(temporal_client, eid))
    assert s["worker-sub-1.0"].origin == "spawn" and s["worker-sub-1.0"].spawned_by_call == "parent.0.c0"
    assert s["parent~summary.0"].agent == "parent~summary"
    assert s["parent.1"].origin == "rewrite" and s["parent.1"].rewrite_of == "parent.0"


async def test_a_relaunched_codex_thread_is_answered_from_the_records_then_continues_what_it_saw(
    gateway_url, temporal_client, recording_engine
):
    """Launch 1's lead thread made two calls, its subagent thread one. A relaunch (`x-grove-launch: 2`, new
    thread ids, as a relaunched `codex exec` sends) repeats the first request: answered from its record,
    nothing generated.
    Its next request diverges from launch 1's: launch 1's second call, which the relaunch never saw, is
    discarded, and the request continues the replayed call on its exact tokens. A subagent thread of the
    relaunch (its parent thread the relaunched lead's) is answered from the subagent's record."""
    eid = await start_episode(temporal_client, "responses-codex-relaunch")
    task = [DEVELOPER, user("Say apple.")]
    first = {**codex_meta("thread-launch-1"), "x-grove-launch": "1"}
    again = {**codex_meta("thread-launch-2"), "x-grove-launch": "2"}
    async with http(gateway_url, eid) as c:
        r0 = await c.post("/responses", json=responses_body(task, stream=False), headers=first)
        assert r0.status_code == 200, r0.text
        seen = [*task, *r0.json()["output"]]
        sub_task = [DEVELOPER, user("Say pear.")]  # a subagent the lead's first call spawned
        sub_first = {**codex_meta("sub-launch-1", parent="thread-launch-1"), "x-grove-launch": "1"}
        sub = await c.post("/responses", json=responses_body(sub_task, stream=False), headers=sub_first)
        assert sub.status_code == 200, sub.text
        r1 = await c.post(
            "/responses", json=responses_body([*seen, user("Again.")], stream=False), headers=first
        )
        assert r1.status_code == 200, r1.text
        assert r1.headers["x-grove-call-id"] == "parent.0.c1"
        await delivered_summary(temporal_client, eid)
        served = len(recording_engine.calls_of(eid))
        replayed = await c.post("/responses", json=responses_body(task, stream=False), headers=again)
        assert replayed.status_code == 200, replayed.text
        assert replayed.headers["x-grove-call-id"] == "parent.0.c0"
        assert (
            replayed.json()["output"] == r0.json()["output"] and len(recording_engine.calls_of(eid)) == served
        )
        sub_again = {**codex_meta("sub-launch-2", parent="thread-launch-2"), "x-grove-launch": "2"}
        sub2 = await c.post("/responses", json=responses_body(sub_task, stream=False), headers=sub_again)
        assert sub2.status_code == 200, sub2.text
        assert sub2.headers["x-grove-call-id"] == sub.headers["x-grove-call-id"] == "worker-sub-launch-1.0.c0"
        assert len(recording_engine.calls_of(eid)) == served
        diverged = await c.post(
            "/responses", json=responses_body([*seen, user("Other.")], stream=False), headers=again
        )
        assert diverged.status_code == 200, diverged.text
        call = diverged.headers["x-grove-call-id"]
    assert extension_of(recording_engine, eid, call, "parent.0.c0")
    s = contexts(await delivered_summary(temporal_client, eid))
    assert s["parent.0"].head == call and s["parent.0"].counts.get("discarded") == 1  # launch 1's c1
    assert s["worker-sub-launch-1.0"].spawned_by_call == "parent.0.c0"
