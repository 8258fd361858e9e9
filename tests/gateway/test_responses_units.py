"""The Responses API's pure parts: parsing a request (the bodies stock Codex 0.171.0 really sent,
models/harness_text/codex_0_171_0.json), its chat form, the refusals, and the answer's items and events.

The round trips check the one property the exact splice needs: the items the gateway returns for a turn,
echoed back in the next request's input as Codex echoes them, read as exactly the earlier messages plus
that turn's assistant message (compared by the chat path's own rule, chat/render.py `same_message`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.records import ChatRecord, Usage
from chat.render import same_message
from gateway.http.responses_response import (
    ResponseShape,
    output_items,
    response_body,
    sse_events,
    stream_events,
)
from gateway.http.routes.errors import error_response
from gateway.intake.chat_request import (
    UnknownModelError,
    UnsupportedContentError,
    UnsupportedParameterError,
    parse_chat_request,
)
from gateway.intake.previous_response import (
    ForeignResponseIdError,
    MalformedResponseIdError,
    PreviousResponse,
    check_episode,
    parse_response_id,
    response_id,
)
from gateway.intake.responses_chat import (
    ChangedInstructionsError,
    DuplicateCallIdError,
    MismatchedToolOutputError,
    ToolNameCollisionError,
    ToolRoute,
    UnmatchedToolOutputError,
    UnresolvedPreviousResponseError,
    accept,
    call_item,
    chat_body,
    chat_form,
)
from gateway.intake.responses_request import (
    ConversationNotServedError,
    InvalidResponsesRequestError,
    UnsupportedInputItemError,
    UnsupportedToolError,
    parse_responses_request,
)

CAPTURE = json.loads(
    (Path(__file__).resolve().parents[2] / "models" / "harness_text" / "codex_0_171_0.json").read_text()
)
REQUESTS = CAPTURE["requests"]
MODEL = "grove"


def _form(body):
    return chat_form(parse_responses_request(body, MODEL))


def _record(response, finish="stop", call_id="c1"):
    return ChatRecord(
        episode_id="ep-1", call_id=call_id, context_id="ctx", agent="lead", kind="action", extends=None,
        messages=[], response=response, finish_reason=finish,
        usage=Usage(prompt_tokens=1700, completion_tokens=23), policy_version=0,
    )  # fmt: skip


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ------------------------------------------------------------------------------------ Codex's bodies


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_captured_codex_request_is_taken_and_passes_the_chat_checks(name):
    request = parse_responses_request(REQUESTS[name]["body"], MODEL)
    form = chat_form(request)
    chat = parse_chat_request(chat_body(request, form), MODEL)
    assert chat.stream is True
    assert form.messages[0]["role"] == "system"
    assert form.messages[0]["content"] == "You are a coding agent. Use the tools, then answer briefly."


def test_the_lead_history_reads_as_these_chat_messages():
    form = _form(REQUESTS["agents_lead_after_wait"]["body"])
    spawn_out = '{"agent_id":"01a2503a-71ff-7302-be90-b85017c082ab","nickname":"Euler"}'
    assert [m["role"] for m in form.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "user"
    ]  # fmt: skip
    assert form.messages[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("call_0", "spawn_agent", '{"message": "Repeat the word: apple"}')],
    }
    assert form.messages[3] == {"role": "tool", "tool_call_id": "call_0", "content": spawn_out}
    assert form.messages[6]["content"].startswith("<subagent_notification>\n")


def test_a_message_and_the_calls_after_it_are_one_assistant_turn():
    form = _form(REQUESTS["tools_after_custom_call"]["body"])
    assert form.sources == ["input[0]", "input[1]", "input[2]", "input[3]", "input[4]", "input[6]"]
    assert form.input_param(4) == "input[4]" and form.input_param(None) == "tools"
    turn = form.messages[4]
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n"
    assert turn["content"] == "Now a patch."
    assert [c["function"]["name"] for c in turn["tool_calls"]] == ["apply_patch"]
    assert json.loads(turn["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    assert form.messages[5]["tool_call_id"] == "call_2"


def test_namespaced_functions_are_flattened_and_routed_back_with_their_namespace():
    form = _form(REQUESTS["agents_lead_first"]["body"])
    names = [t["function"]["name"] for t in form.tools or []]
    assert names == [
        "exec_command", "write_stdin", "request_user_input", "apply_patch", "view_image",
        "close_agent", "resume_agent", "send_input", "spawn_agent", "wait_agent",
    ]  # fmt: skip
    assert all(set(t) == {"type", "function"} and "strict" not in t["function"] for t in form.tools or [])
    item = call_item(_call("call_9", "spawn_agent", '{"message": "go"}'), form.routes)
    assert item == {
        "type": "function_call", "call_id": "call_9", "name": "spawn_agent",
        "arguments": '{"message": "go"}', "namespace": "multi_agent_v1",
    }  # fmt: skip
    plain = call_item(_call("call_8", "exec_command", '{"cmd": "ls"}'), form.routes)
    assert "namespace" not in plain and plain["type"] == "function_call"


def test_a_custom_tool_is_a_function_of_one_string_and_comes_back_as_a_custom_call():
    form = _form(REQUESTS["tools_first"]["body"])
    patch_tool = next(t for t in form.tools or [] if t["function"]["name"] == "apply_patch")
    params = patch_tool["function"]["parameters"]
    assert params["required"] == ["input"] and params["properties"]["input"]["type"] == "string"
    assert "start: begin_patch hunk+ end_patch" in params["properties"]["input"]["description"]
    exact = call_item(_call("c", "apply_patch", '{"input": "*** Begin Patch\\n"}'), form.routes)
    assert exact == {
        "type": "custom_tool_call",
        "call_id": "c",
        "name": "apply_patch",
        "input": "*** Begin Patch\n",
    }
    # anything but exactly {"input": <string>} goes back as the policy wrote it
    for arguments in ('{"input": "x", "more": 1}', '{"input": 3}', "not json"):
        item = call_item(_call("c", "apply_patch", arguments), form.routes)
        assert item["type"] == "function_call" and item["arguments"] == arguments


def test_the_compaction_request_has_no_tools_and_keeps_the_history():
    form = _form(REQUESTS["compaction_summary_call"]["body"])
    assert form.tools is None
    assert [m["role"] for m in form.messages] == ["system", "user", "assistant", "tool", "user"]
    assert "CONTEXT CHECKPOINT COMPACTION" in form.messages[-1]["content"]


def test_a_string_input_and_instructions():
    form = _form({"model": MODEL, "input": "hi", "instructions": "Be brief."})
    assert form.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert form.sources == ["instructions", "input[0]"] and form.input_param(0) == "instructions"
    body = chat_body(
        parse_responses_request(
            {"model": MODEL, "input": "hi", "max_output_tokens": 64, "temperature": 0.7}, MODEL
        ),
        form,
    )
    assert body["max_tokens"] == 64 and body["temperature"] == 0.7 and "tools" not in body


# ------------------------------------------------------------------------------------ round trips


def _echo(items):
    """The items as Codex puts them in its next input: as returned, with their ids and status."""
    return [json.loads(json.dumps(item)) for item in items]


@pytest.mark.parametrize(
    "response",
    [
        {
            "role": "assistant",
            "content": "Spawning.",
            "tool_calls": [
                _call("call_a", "spawn_agent", '{"message": "Repeat: apple"}'),
                _call("call_b", "exec_command", '{"cmd":"echo hi"}'),
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call(
                    "call_p",
                    "apply_patch",
                    '{"input": "*** Begin Patch\\n*** Add File: b.txt\\n+x\\n*** End Patch\\n"}',
                )
            ],
        },
        {
            "role": "assistant",
            "content": "\n",
            "tool_calls": [_call("call_w", "wait_agent", '{"targets": ["a"]}')],
        },
        {"role": "assistant", "content": "The answer is apple."},
        {"role": "assistant", "content": ""},
    ],
    ids=["text-and-two-calls", "custom-call", "whitespace-text", "text", "empty"],
)
def test_the_items_of_a_turn_read_back_as_that_turn(response):
    first = json.loads(json.dumps(REQUESTS["agents_lead_first"]["body"]))
    before = _form(first)
    returned = output_items(_record(response), before.routes)
    following = [*first["input"], *_echo(returned)]
    for call in response.get("tool_calls", []):
        kind = (
            "custom_tool_call_output" if call["function"]["name"] == "apply_patch" else "function_call_output"
        )
        following.append({"type": kind, "call_id": call["id"], "output": "ok"})
    after = _form({**first, "input": following})
    n = len(before.messages)
    assert all(same_message(a, b) for a, b in zip(after.messages[:n], before.messages, strict=True))
    assert same_message(after.messages[n], response)
    assert [m["role"] for m in after.messages[n + 1 :]] == ["tool"] * len(response.get("tool_calls", []))


# ------------------------------------------------------------------------------------ refusals


def _refused(body_update=None, *, inputs=None, tools=None):
    body = {"model": MODEL, "input": inputs or [{"role": "user", "content": "hi"}], **(body_update or {})}
    if tools is not None:
        body["tools"] = tools
    return lambda: chat_form(parse_responses_request(body, MODEL))


FC = {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{}"}
CTC = {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "x"}
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.mark.parametrize(
    ("case", "error", "param"),
    [
        (
            _refused(inputs=[USER, {"type": "reasoning", "summary": [], "encrypted_content": "e"}]),
            UnsupportedInputItemError,
            "input[1].type",
        ),
        (
            _refused(inputs=[USER, {"type": "web_search_call", "id": "ws_1"}]),
            UnsupportedInputItemError,
            "input[1].type",
        ),
        (
            _refused(inputs=[USER, {"type": "item_reference", "id": "msg_1"}]),
            UnsupportedInputItemError,
            "input[1].type",
        ),
        (
            _refused(inputs=[USER, {"type": "function_call_output", "call_id": "nope", "output": "x"}]),
            UnmatchedToolOutputError,
            "input[1].call_id",
        ),
        (
            _refused(
                inputs=[USER, FC, {"type": "custom_tool_call_output", "call_id": "call_1", "output": "x"}]
            ),
            MismatchedToolOutputError,
            "input[2].type",
        ),
        (
            _refused(
                inputs=[USER, CTC, {"type": "function_call_output", "call_id": "call_2", "output": "x"}]
            ),
            MismatchedToolOutputError,
            "input[2].type",
        ),
        (
            _refused(inputs=[USER, FC, {**FC, "name": "write_stdin"}]),
            DuplicateCallIdError,
            "input[2].call_id",
        ),
        (
            _refused(
                inputs=[
                    USER,
                    FC,
                    {"type": "function_call_output", "call_id": "call_1", "output": "a"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "b"},
                ]
            ),
            DuplicateCallIdError,
            "input[3].call_id",
        ),
        (
            _refused(inputs=[USER, {"type": "function_call_output", "call_id": "call_1", "output": "x"}, FC]),
            UnmatchedToolOutputError,
            "input[1].call_id",
        ),
        (
            _refused(
                inputs=[
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "data:"}],
                    }
                ]
            ),
            UnsupportedContentError,
            "input[0].content[0].type",
        ),
        (
            _refused(
                inputs=[
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "a", "annotations": [{"x": 1}]}],
                    }
                ]
            ),
            UnsupportedContentError,
            "input[0].content[0]",
        ),
        (_refused(inputs=[{**USER, "phase": "final"}]), InvalidResponsesRequestError, "input[0].phase"),
        (
            _refused(inputs=[{"type": "message", "role": "tool", "content": "x"}]),
            InvalidResponsesRequestError,
            "input[0].role",
        ),
        (_refused(tools=[{"type": "web_search"}]), UnsupportedToolError, "tools[0].type"),
        (
            _refused(tools=[{"type": "tool_search", "execution": "client"}]),
            UnsupportedToolError,
            "tools[0].type",
        ),
        (
            _refused(
                tools=[
                    {"type": "function", "name": "spawn_agent"},
                    {
                        "type": "namespace",
                        "name": "ns",
                        "tools": [{"type": "function", "name": "spawn_agent"}],
                    },
                ]
            ),
            ToolNameCollisionError,
            "tools[1].tools[0]",
        ),
        (
            _refused({"conversation": "conv_1"}),
            ConversationNotServedError,
            "conversation",
        ),
        (_refused({"previous_response_id": "resp_1"}), MalformedResponseIdError, "previous_response_id"),
        (
            _refused({"previous_response_id": "resp_!" + response_id("ep", "c").removeprefix("resp_")}),
            MalformedResponseIdError,
            "previous_response_id",
        ),
        (_refused({"tool_choice": "required"}), UnsupportedParameterError, "tool_choice"),
        (
            _refused({"text": {"format": {"type": "json_schema", "schema": {}}}}),
            UnsupportedParameterError,
            "text",
        ),
        (_refused({"include": ["message.output_text.logprobs"]}), UnsupportedParameterError, "include"),
        (_refused({"frobnicate": 1}), UnsupportedParameterError, "frobnicate"),
        (_refused({"temperature": True}), InvalidResponsesRequestError, "temperature"),
        (_refused({"model": "gpt-6"}), UnknownModelError, "model"),
    ],
)
def test_bad_requests_are_refused_by_name(case, error, param):
    with pytest.raises(error) as err:
        case()
    assert err.value.param == param
    response = error_response(err.value)
    body = json.loads(response.body)
    assert response.status_code == (404 if error is UnknownModelError else 400)
    assert body["error"]["code"] == error.__name__ and body["error"]["param"] == param


def test_codex_own_accepted_parameters_change_nothing():
    """What Codex sends besides input and tools (reasoning, include, text.verbosity, client_metadata...) is
    accepted and gives the same chat body as without it."""
    full = REQUESTS["tools_first"]["body"]
    bare = {k: full[k] for k in ("model", "input", "tools", "stream")}
    a, b = parse_responses_request(full, MODEL), parse_responses_request(bare, MODEL)
    assert chat_body(a, chat_form(a)) == chat_body(b, chat_form(b))


# ------------------------------------------------------------------------------------ previous_response_id

CHAIN_TOOLS = [
    {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "definition": "s"}},
    {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn_agent"}]},
]  # fmt: skip
OUTPUTS = [
    {"type": "function_call_output", "call_id": "call_s", "output": '{"agent_id":"a1","nickname":"Euler"}'},
    {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."},
    USER,
]  # fmt: skip


def _first_call(episode="run/s000001/t0/g0", call="parent.0.c0"):
    """The first request of a chain, answered with TURN (a namespaced call and a custom call)."""
    first = parse_responses_request(
        {"model": MODEL, "instructions": "Be brief.", "input": "Start.", "tools": CHAIN_TOOLS}, MODEL
    )
    record = ChatRecord(
        **{
            **_record(TURN, call_id=call).model_dump(),
            "episode_id": episode,
            "messages": chat_form(first).messages,
        }
    )
    return first, record


def _previous(record):
    return PreviousResponse(parse_response_id(response_id(record.episode_id, record.call_id)), [
        *record.messages, record.response
    ])  # fmt: skip


def _chained(record, items, **extra):
    rid = response_id(record.episode_id, record.call_id)
    body = {"model": MODEL, "input": items, "tools": CHAIN_TOOLS, "previous_response_id": rid, **extra}
    return parse_responses_request(body, MODEL)


def test_a_response_id_names_its_call_and_nothing_else():
    rid = response_id("run/s000001/t0/g0", "worker-2.1.c3")
    ref = parse_response_id(rid)
    assert rid.startswith("resp_") and (ref.episode_id, ref.call_id) == ("run/s000001/t0/g0", "worker-2.1.c3")
    assert response_id("run/s000001/t0/g0", "worker-2.1.c4") != rid != response_id("run/s000001/t0/g1", "c")
    check_episode(ref, "run/s000001/t0/g0")
    with pytest.raises(ForeignResponseIdError) as err:
        check_episode(ref, "run/s000001/t0/g1")
    assert err.value.param == "previous_response_id" and "run/s000001/t0/g0" in str(err.value)
    for bad in ("resp_", "msg_" + rid[5:], rid[:-1], rid + "=", "resp_" + "Zm9v"):  # "foo": no call id
        with pytest.raises(MalformedResponseIdError):
            parse_response_id(bad)


def test_a_chained_request_is_the_recorded_history_then_its_items_as_if_sent_whole():
    """The history is the record's messages and response, unchanged; the rest is what the same items give
    after the response's output items echoed whole (Codex's way), message by message."""
    first, record = _first_call()
    chained = chat_form(_chained(record, OUTPUTS), _previous(record))
    returned = output_items(record, chat_form(first).routes)
    whole = _form(
        {"model": MODEL, "instructions": "Be brief.", "input": [{**USER, "content": "Start."}, *returned,
         *OUTPUTS], "tools": CHAIN_TOOLS}
    )  # fmt: skip
    k = len(record.messages) + 1
    assert chained.messages[:k] == [*record.messages, record.response]
    assert chained.sources == ["previous_response_id"] * k + ["input[0]", "input[1]", "input[2]"]
    assert len(chained.messages) == len(whole.messages)
    assert all(same_message(a, b) for a, b in zip(chained.messages, whole.messages, strict=True))
    assert chained.messages[k:] == whole.messages[k:]


def test_a_chained_request_waits_for_its_history_and_is_checked_against_it():
    _, record = _first_call()
    pending = accept(_chained(record, OUTPUTS))  # outputs of calls it does not hold: not refused yet
    assert pending.pending and [m["role"] for m in pending.form.messages] == ["tool", "tool", "user"]
    with pytest.raises(UnresolvedPreviousResponseError):
        pending.canonical()
    done = pending.continuing(_previous(record))
    assert not done.pending and done.canonical().messages == done.form.messages
    previous = _previous(record)
    swapped = [{**OUTPUTS[0], "type": "custom_tool_call_output"}, OUTPUTS[2]]
    cases = [
        (swapped, {}, MismatchedToolOutputError, "input[0].type"),
        ([{**OUTPUTS[0], "call_id": "call_x"}], {}, UnmatchedToolOutputError, "input[0].call_id"),
        ([*OUTPUTS, OUTPUTS[0]], {}, DuplicateCallIdError, "input[3].call_id"),
        ([{**CTC, "call_id": "call_s"}], {}, DuplicateCallIdError, "input[0].call_id"),
        (OUTPUTS, {"instructions": "Be long."}, ChangedInstructionsError, "instructions"),
    ]
    for items, extra, error, param in cases:
        with pytest.raises(error) as err:
            chat_form(_chained(record, items, **extra), previous)
        assert err.value.param == param, (items, err.value)
    assert "previous_response_id" in str(err.value)
    same = chat_form(_chained(record, OUTPUTS, instructions="Be brief."), previous)
    assert same.messages == chat_form(_chained(record, OUTPUTS), previous).messages


def test_a_call_after_the_previous_response_joins_its_turn_without_touching_the_record():
    _, record = _first_call()
    kept = json.dumps(record.model_dump(), sort_keys=True)
    form = chat_form(_chained(record, [CTC]), _previous(record))
    assert [c["id"] for c in form.messages[-1]["tool_calls"]] == ["call_s", "call_p", "call_2"]
    assert json.dumps(record.model_dump(), sort_keys=True) == kept


# ------------------------------------------------------------------------------------ the answer

ROUTES = {"spawn_agent": ToolRoute("function", "multi_agent_v1"), "apply_patch": ToolRoute("custom")}
TURN = {
    "role": "assistant",
    "content": "Working.",
    "tool_calls": [
        _call("call_s", "spawn_agent", '{"message":"m"}'),
        _call("call_p", "apply_patch", '{"input":"P"}'),
    ],
}


def test_the_stream_is_the_responses_event_sequence():
    events = stream_events(_record(TURN), ResponseShape(MODEL, 1700000000, ROUTES))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["model"] == MODEL
    assert final["usage"]["input_tokens"] == 1700 and final["usage"]["output_tokens"] == 23
    assert final["usage"]["total_tokens"] == 1723
    assert [i["type"] for i in final["output"]] == ["message", "function_call", "custom_tool_call"]
    assert final["output"][1]["namespace"] == "multi_agent_v1" and final["output"][2]["input"] == "P"
    assert events[4]["delta"] == "Working." and events[13]["delta"] == "P"
    assert events[2]["item"]["content"] == [] and events[8]["item"]["arguments"] == ""
    assert len({i["id"] for i in final["output"]}) == 3


def test_sse_lines_name_each_event_and_carry_its_json():
    events = stream_events(_record({"role": "assistant", "content": "hi"}), ResponseShape(MODEL, 0, {}))
    text = "".join(sse_events(events))
    blocks = [b for b in text.split("\n\n") if b]
    assert len(blocks) == len(events)
    for block, event in zip(blocks, events, strict=True):
        head, data = block.split("\n")
        assert head == f"event: {event['type']}" and json.loads(data.removeprefix("data: ")) == event


def test_a_turn_cut_at_its_budget_completes_with_its_message_marked_incomplete():
    record = _record({"role": "assistant", "content": "cut off"}, finish="length")
    body = response_body(record, ResponseShape(MODEL, 0, {}))
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert (
        body["output"][0]["status"] == "incomplete" and body["output"][0]["content"][0]["text"] == "cut off"
    )
    events = stream_events(record, ResponseShape(MODEL, 0, {}))
    assert events[-1]["type"] == "response.completed" and events[-2]["item"]["status"] == "incomplete"
    done = _record({"role": "assistant", "content": "done"})
    assert response_body(done, ResponseShape(MODEL, 0, {}))["output"][0]["status"] == "completed"


def test_ids_are_a_function_of_the_call():
    shape = ResponseShape(MODEL, 0, ROUTES)
    a, b = response_body(_record(TURN), shape), response_body(_record(TURN), shape)
    c = response_body(_record(TURN, call_id="c2"), shape)
    assert a["id"] == b["id"] != c["id"] and a["id"].startswith("resp_")
    assert [i["id"] for i in a["output"]] == [i["id"] for i in b["output"]]


def test_a_refused_stream_ends_with_response_failed():
    """A stream whose last event the ledger refused ends with the Responses API's own failure event."""
    from gateway.http.wire.refusal import Refusal
    from gateway.http.wire.responses import RESPONSES_ERRORS

    refusal = Refusal(409, "conflict_error", "EpisodeClosedError", "episode ep-1 is closed")
    head, data = RESPONSES_ERRORS.event(refusal).decode().rstrip("\n").split("\n")
    event = json.loads(data.removeprefix("data: "))
    assert head == "event: response.failed" and event["type"] == "response.failed"
    assert event["response"]["status"] == "failed"
    assert event["response"]["error"] == {"code": "EpisodeClosedError", "message": "episode ep-1 is closed"}
    answer = RESPONSES_ERRORS.response(refusal)
    assert answer.status_code == 409 and json.loads(answer.body)["error"]["code"] == "EpisodeClosedError"


def test_a_discontinuity_is_named_by_its_input_item_and_keeps_its_code():
    from chat.render import UndeclaredDiscontinuityError
    from gateway.pipeline.hints import MissingIdentityHeadersError

    form = _form(REQUESTS["tools_after_custom_call"]["body"])
    plain = form.in_input_terms(UndeclaredDiscontinuityError("messages[5] differs", index=5, field="content"))
    body = json.loads(error_response(plain).body)["error"]
    assert (body["code"], body["param"]) == ("UndeclaredDiscontinuityError", "input[6]")
    assert body["message"].startswith("input[6]: messages[5] differs")
    hinted = form.in_input_terms(MissingIdentityHeadersError("no header", index=0, field="role"))
    body = json.loads(error_response(hinted).body)["error"]
    assert (body["code"], body["param"]) == ("MissingIdentityHeadersError", "input[0]")
