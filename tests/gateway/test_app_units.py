"""The gateway's pure parts: episode references, tokens, identity headers and the OpenCode adapter,
context routing, the continuation decision, request validation and sampling, response chunks, chat
records, settings, and the HTTP error mapping (app without its lifespan: nothing reaches Temporal)."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from fastapi import FastAPI

from capture.records import CorruptChatRecordError, load_record, save_record
from gateway.http.app import create_app
from gateway.http.auth import (
    MalformedTokenError,
    MissingTokenError,
    WrongEpisodeTokenError,
    check_token,
    issue_token,
)
from gateway.http.chat_response import completion_body, sse_events, stream_chunks
from gateway.http.episode_ref import InvalidEpisodeRefError, episode_id_of, episode_ref
from gateway.http.routes.errors import domain_error
from gateway.http.settings import GatewaySettings, GatewaySettingsError
from gateway.intake.chat_request import (
    InvalidChatRequestError,
    InvalidSamplingError,
    UnknownModelError,
    UnsupportedParameterError,
    parse_chat_request,
    sampling_for,
)
from gateway.pipeline import opencode
from gateway.pipeline.capture import Capture
from gateway.pipeline.capture_errors import ResponsePendingError
from gateway.pipeline.identity import (
    InvalidIdentityHeaderError,
    RewriteMode,
    Spawner,
    canonical_agent,
    grove_identity,
)
from gateway.pipeline.routing import RoutingError, identify, live_contexts, route, spawn_target
from grove.receipts import CallKind, CallState, ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from grove.store_layout import chat_record_key
from ledger.accounting import ContextSummary
from ledger.context_view import ContextView
from storage.local import LocalStore
from tests.gateway.chat_kit import SYSTEM, TOOL_RESPONSE, TOOLS, USER, record

SECRET = "unit-test-secret-0123456789"

# ---------------------------------------------------------------------------------------------- refs


def test_episode_ref_round_trips_ids_with_slashes():
    assert episode_ref("run/s000001/t3/g0") == "cnVuL3MwMDAwMDEvdDMvZzA"  # written by hand: base64url, no '='
    assert episode_id_of("cnVuL3MwMDAwMDEvdDMvZzA") == "run/s000001/t3/g0"
    assert episode_id_of(episode_ref("é/ü?x")) == "é/ü?x"


@pytest.mark.parametrize("ref", ["cnVu=", "cn+u", "a", "YR", ""])
def test_malformed_episode_refs_are_refused(ref):
    # "YR" decodes to "a" but is not its canonical reference ("YQ"): it names no episode
    with pytest.raises(InvalidEpisodeRefError):
        episode_id_of(ref)


# ---------------------------------------------------------------------------------------------- auth


def test_token_is_hmac_sha256_of_the_episode_id():
    # RFC 4231 test case 2 (key "Jefe")
    expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert issue_token("Jefe", "what do ya want for nothing?") == "grove-" + expected


def test_token_checks_name_the_failure():
    token = issue_token(SECRET, "ep/1")
    check_token(SECRET, "ep/1", f"Bearer {token}")
    check_token(SECRET, "ep/1", f"bearer  {token} ")
    with pytest.raises(MissingTokenError):
        check_token(SECRET, "ep/1", None)
    for bad in ("Basic abc", f"Bearer {token[:-1]}", "Bearer sk-123", token):
        with pytest.raises(MalformedTokenError):
            check_token(SECRET, "ep/1", bad)
    with pytest.raises(WrongEpisodeTokenError, match="ep/2"):
        check_token(SECRET, "ep/2", f"Bearer {token}")


# ---------------------------------------------------------------------------------------------- identity


def test_grove_headers_default_to_the_parent_agent():
    ident = grove_identity({})
    assert (ident.agent, ident.context_id, ident.spawner, ident.rewrite, ident.kind) == (
        "parent", None, None, RewriteMode.NONE, CallKind.ACTION
    )  # fmt: skip


def test_grove_headers_name_agent_spawner_rewrite_and_kind():
    ident = grove_identity({"x-grove-agent": "worker-1", "x-grove-spawned-by": "parent.0.c2"})
    assert ident.agent == "worker-1" and ident.spawner == Spawner(call_id="parent.0.c2")
    ident = grove_identity(
        {"x-grove-agent": "w", "x-grove-parent-context": "parent.0", "x-grove-rewrite": "1"}
    )
    assert ident.spawner == Spawner(context_id="parent.0") and ident.rewrite == RewriteMode.DECLARED
    aux = grove_identity({"x-grove-agent": "w", "x-grove-call-kind": "auxiliary"})
    assert (aux.agent, aux.kind, aux.rewrite) == ("w~aux", CallKind.AUXILIARY, RewriteMode.IF_NOT_EXTENSION)
    # a compaction's summary call and a title call: each its agent's auxiliary context of its kind
    summary = grove_identity({"x-grove-agent": "w", "x-grove-call-kind": "summary"})
    assert (summary.agent, summary.kind, summary.spawner) == ("w~summary", CallKind.SUMMARY, None)
    title = grove_identity({"x-grove-call-kind": "Title"})
    assert (title.agent, title.kind) == ("parent~title", CallKind.TITLE)
    ident = grove_identity({"x-grove-context": "worker-1.0"})
    assert (ident.agent, ident.context_id) == (None, "worker-1.0")


@pytest.mark.parametrize(
    "headers",
    [
        {"x-grove-agent": "a\tb"},  # not printable
        {"x-grove-agent": "x" * 129},  # longer than an id may be
        {"x-grove-agent": ""},
        {"x-grove-context": "../x"},
        {"x-grove-spawned-by": "p.0.c1", "x-grove-parent-context": "p.0"},
        {"x-grove-rewrite": "maybe"},
        {"x-grove-call-kind": "caption"},  # no call kind
    ],
)
def test_bad_identity_headers_are_refused(headers):
    with pytest.raises(InvalidIdentityHeaderError):
        grove_identity(headers)


def test_agent_names_with_spaces_dots_and_colons_are_made_canonical():
    names = ["Math Tutor", "team.lead", "role:critic", "a~aux", "a/b", "Math-Tutor", "Ünïcode agent"]
    agents = [grove_identity({"x-grove-agent": n}).agent for n in names]
    canonical = re.compile(r"^[A-Za-z0-9_-]{1,96}$")
    assert all(canonical.match(a) for a in agents), agents
    assert len(set(agents)) == len(names)  # distinct names stay distinct ("Math-Tutor" stays itself)
    assert agents[5] == "Math-Tutor" and agents[0].startswith("Math-Tutor-") and agents[0] != agents[5]
    assert "~" not in agents[3]  # never collides with the gateway's auxiliary agents
    # deterministic: the same name maps to the same agent, also through canonical_agent
    assert [canonical_agent(n) for n in names] == agents
    assert canonical_agent("x" * 128).startswith("x" * 80 + "-") and len(canonical_agent("x" * 128)) == 89


def test_only_grove_spawner_headers_make_a_request_respawn():
    assert grove_identity({"x-grove-agent": "w", "x-grove-spawned-by": "parent.0.c0"}).respawn
    assert grove_identity({"x-grove-agent": "w", "x-grove-parent-context": "parent.0"}).respawn
    assert not grove_identity({"x-grove-agent": "w"}).respawn
    assert not grove_identity({}).named and grove_identity({"x-grove-agent": "parent"}).named
    child = opencode.identify(
        {"x-session-id": "ses_b", "x-parent-session-id": "ses_a"}, [SYSTEM, USER], TOOLS, {"parent"}
    )
    assert child.spawner is not None and not child.respawn


def test_opencode_root_child_and_auxiliary_calls():
    root = opencode.identify({"x-session-id": "ses_a"}, [SYSTEM, USER], TOOLS, set())
    assert (root.agent, root.spawner, root.root_session, root.session_id) == ("parent", None, True, "ses_a")
    child = opencode.identify(
        {"x-session-id": "ses_b", "x-parent-session-id": "ses_a"}, [SYSTEM, USER], TOOLS, {"parent"}
    )
    assert (child.agent, child.spawner, child.root_session) == (
        "worker-ses_b",
        Spawner(agent="parent"),
        False,
    )
    title = [{"role": "system", "content": "You are a title generator. You output ONLY a title."}, USER]
    t = opencode.identify({"x-session-id": "ses_a"}, title, None, {"parent"})
    assert (t.agent, t.kind, t.rewrite) == ("parent~title", CallKind.TITLE, RewriteMode.IF_NOT_EXTENSION)
    # a subagent's compaction call lacks x-parent-session-id: still the worker's, since it is known
    summary = [
        {"role": "system", "content": [{"type": "text", "text": "You are a context summarization agent."}]},
        USER,
    ]
    s = opencode.identify({"x-session-id": "ses_b"}, summary, None, {"parent", "worker-ses_b"})
    assert (s.agent, s.kind) == ("worker-ses_b~summary", CallKind.SUMMARY)  # the summary of its context
    # the same system prompt *with* tools is not a title call
    assert opencode.identify({"x-session-id": "ses_a"}, title, TOOLS, {"parent"}).kind == CallKind.ACTION


def test_opencode_post_compaction_request_is_a_recognised_rewrite():
    compacted = [
        SYSTEM,
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": "We read a.txt."},
        {"role": "user", "content": "Continue if you have next steps, or stop."},
    ]
    assert (
        opencode.identify({"x-session-id": "s"}, compacted, TOOLS, set()).rewrite
        == RewriteMode.IF_NOT_EXTENSION
    )
    later = [*compacted, {"role": "assistant", "content": "ok"}, USER]
    assert opencode.identify({"x-session-id": "s"}, later, TOOLS, set()).rewrite == RewriteMode.NONE


def test_grove_headers_win_over_opencode_headers():
    summary = ledger_summary([])
    ident = identify({"x-session-id": "ses_a", "x-grove-agent": "planner"}, [USER], None, summary)
    assert ident.agent == "planner" and ident.session_id is None


# ---------------------------------------------------------------------------------------------- routing


def ctx_summary(context_id, agent, origin, head=None, calls=0, retired_by=None, pending=()):
    counts = dict.fromkeys(CallState, 0)
    counts[CallState.COMPLETED] = calls
    return ContextSummary(
        context_id=context_id, agent=agent, origin=origin, retired_by=retired_by, head=head, counts=counts,
        pending=list(pending),
    )  # fmt: skip


def ledger_summary(contexts) -> ContextView:
    """A context view as the workflow's `context_view` gives it for these contexts (every one of an agent:
    its next context is numbered after them)."""
    counts = Counter(c.agent for c in contexts)
    roots = [c.agent for c in contexts if c.origin == ContextOrigin.ROOT and "~" not in c.agent]
    return ContextView(
        episode_id="ep/1", group_id="g", closed=False, totals={}, contexts=contexts,
        context_counts=dict(counts), next_context={a: f"{a}.{n}" for a, n in counts.items()},
        root_agents=list(dict.fromkeys(roots))[:2],
    )  # fmt: skip


PARENT = ctx_summary("parent.0", "parent", ContextOrigin.ROOT, head="parent.0.c1", calls=2)


def test_route_opens_root_and_spawn_contexts_for_new_agents():
    s = ledger_summary([PARENT])
    target = route(s, grove_identity({"x-grove-agent": "planner"}))
    assert target.current is None and target.opening == ContextRecord(
        context_id="planner.0", agent="planner", origin=ContextOrigin.ROOT
    )
    for headers in ({"x-grove-spawned-by": "parent.0.c1"}, {"x-grove-parent-context": "parent.0"}):
        target = route(s, grove_identity({"x-grove-agent": "worker-1", **headers}))
        assert target.opening == ContextRecord(
            context_id="worker-1.0",
            agent="worker-1",
            origin=ContextOrigin.SPAWN,
            spawned_by_call="parent.0.c1",
        )
    with pytest.raises(RoutingError, match="does not exist"):
        route(s, grove_identity({"x-grove-agent": "w", "x-grove-parent-context": "nope.0"}))


def test_route_finds_the_agents_current_context_and_numbers_rewrites():
    retired = ctx_summary("parent.0", "parent", ContextOrigin.ROOT, head="parent.0.c1", retired_by="parent.1")
    current = ctx_summary("parent.1", "parent", ContextOrigin.REWRITE, head="parent.1.c0", calls=1)
    target = route(ledger_summary([retired, current]), grove_identity({}))
    assert (target.context_id, target.current, target.opening, target.rewrite_id) == (
        "parent.1", current, None, "parent.2"
    )  # fmt: skip


def test_route_refuses_contexts_of_other_agents_and_undeclared_new_contexts():
    s = ledger_summary([PARENT])
    with pytest.raises(RoutingError, match="belongs to agent 'parent'"):
        route(s, grove_identity({"x-grove-agent": "w", "x-grove-context": "parent.0"}))
    with pytest.raises(RoutingError, match="declared rewrite"):
        route(s, grove_identity({"x-grove-context": "parent.7"}))
    target = route(s, grove_identity({"x-grove-context": "parent.7", "x-grove-rewrite": "1"}))
    assert (target.context_id, target.rewrite_id) == ("parent.0", "parent.7")


def test_a_worker_spawned_again_has_several_live_contexts_and_the_next_spawn_is_numbered():
    w0 = ctx_summary("w.0", "w", ContextOrigin.SPAWN, head="w.0.c1", calls=2)
    w0 = w0.model_copy(update={"spawned_by_call": "parent.0.c0"})
    w1 = ctx_summary("w.1", "w", ContextOrigin.SPAWN, head="w.1.c0", calls=1)
    s = ledger_summary([PARENT, w0, w1])
    assert [c.context_id for c in live_contexts(s, "w")] == ["w.1", "w.0"]  # most recent first
    assert route(s, grove_identity({"x-grove-agent": "w"})).context_id == "w.1"
    target = spawn_target(s, grove_identity({"x-grove-agent": "w", "x-grove-spawned-by": "parent.0.c1"}), "w")
    assert (target.current, target.opening) == (
        None,
        ContextRecord(context_id="w.2", agent="w", origin=ContextOrigin.SPAWN, spawned_by_call="parent.0.c1"),
    )


# ---------------------------------------------------------------------------------------------- requests


def test_parse_chat_request_accepts_what_opencode_sends():
    body = {
        "model": "m", "messages": [SYSTEM, USER], "tools": TOOLS, "tool_choice": "auto", "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": 32,
    }  # fmt: skip
    request = parse_chat_request(body, "m")
    assert request.stream and request.include_usage and request.max_tokens == 32


@pytest.mark.parametrize(
    ("extra", "error", "param"),
    [
        ({"n": 2}, UnsupportedParameterError, "n"),
        ({"logit_bias": {"1": 2}}, UnsupportedParameterError, "logit_bias"),
        ({"frequency_penalty": 0.1}, UnsupportedParameterError, "frequency_penalty"),
        ({"tool_choice": "required"}, UnsupportedParameterError, "tool_choice"),
        ({"seed": 3}, UnsupportedParameterError, "seed"),
        ({"stop": ["\n"]}, UnsupportedParameterError, "stop"),
        ({"mystery": 1}, UnsupportedParameterError, "mystery"),
        ({"model": "other"}, UnknownModelError, "model"),
        ({"messages": []}, InvalidChatRequestError, "messages"),
        ({"messages": [{"role": "developer", "content": "x"}]}, InvalidChatRequestError, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, InvalidChatRequestError, "messages[0].content"),
    ],
)
def test_parse_chat_request_refuses_what_grove_cannot_mirror(extra, error, param):
    with pytest.raises(error) as err:
        parse_chat_request({"model": "m", "messages": [USER], **extra}, "m")
    assert err.value.param == param


def test_no_op_values_of_refused_parameters_are_accepted():
    body = {"model": "m", "messages": [USER], "n": 1, "logit_bias": {}, "presence_penalty": 0, "seed": None}
    parse_chat_request(body, "m")


def test_sampling_overrides_the_episodes_sampling():
    base = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=64)
    req = lambda **kw: parse_chat_request({"model": "m", "messages": [USER], **kw}, "m")  # noqa: E731
    assert sampling_for(req(), base) is None  # the episode's own
    assert sampling_for(req(max_tokens=8), base) == SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=8)
    assert sampling_for(req(max_completion_tokens=5, temperature=1.2), base) == SamplingConfig(
        temperature=1.2, top_p=0.9, max_tokens=5
    )
    with pytest.raises(InvalidSamplingError, match="temperature"):
        sampling_for(req(temperature=0), base)
    with pytest.raises(InvalidSamplingError):
        sampling_for(req(top_p=0), base)
    with pytest.raises(InvalidSamplingError, match="disagree"):
        sampling_for(req(max_tokens=4, max_completion_tokens=5), base)


# ---------------------------------------------------------------------------------------------- responses


def test_tool_call_response_streams_as_chunks_then_usage_then_done():
    rec = record([SYSTEM, USER], TOOL_RESPONSE, TOOLS)
    body = completion_body(rec, "m", 7)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    chunks = stream_chunks(rec, "m", 7, include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"tool_calls": [{"index": 0, **TOOL_RESPONSE["tool_calls"][0]}]},
        {},
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 13
    events = list(sse_events(chunks))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: {") for e in events[:-1])
    assert all("usage" not in c for c in stream_chunks(rec, "m", 7, include_usage=False))


# ---------------------------------------------------------------------------------------------- records


def test_chat_records_round_trip_and_refuse_foreign_objects(tmp_path):
    store = LocalStore(tmp_path)
    rec = record([SYSTEM, USER], TOOL_RESPONSE, TOOLS)
    assert chat_record_key("ep/1", "parent.0.c0") == "staging/ep/1/parent.0.c0.chat.json"
    save_record(store, rec)
    save_record(store, rec)  # a retried write verifies
    assert load_record(store, "ep/1", "parent.0.c0") == rec
    assert load_record(store, "ep/1", "parent.0.c1") is None
    store.put(chat_record_key("ep/1", "parent.0.c1"), store.get(chat_record_key("ep/1", "parent.0.c0")))
    with pytest.raises(CorruptChatRecordError, match="not of call 'parent.0.c1'"):
        load_record(store, "ep/1", "parent.0.c1")


def test_a_call_being_delivered_is_known_under_its_lost_attempt_ids_too(tmp_path):
    """A request delivering call c0 may complete it as c0.r1 (a lost attempt was re-admitted): a racing
    request that sees c0.r1 as the head must wait for it, and only for it."""
    capture = Capture(None, LocalStore(tmp_path))  # no episode is reached
    capture._delivering[("ep/1", "parent.0.c1")] += 1
    assert capture.delivering("ep/1", "parent.0.c1") and capture.delivering("ep/1", "parent.0.c1.r2")
    assert not capture.delivering("ep/1", "parent.0.c10") and not capture.delivering("ep/2", "parent.0.c1")
    capture.release("ep/1", "parent.0.c1")
    assert not capture.delivering("ep/1", "parent.0.c1.r2")


async def test_a_response_pending_refusal_is_a_409_with_retry_after():
    err = ResponsePendingError(
        "call c0 is being delivered", episode_id="e", context_id="p.0", call_id="p.0.c0"
    )
    response = await domain_error(None, err)
    assert (response.status_code, response.headers["retry-after"]) == (409, "1")
    assert json.loads(response.body)["error"]["code"] == "ResponsePendingError"


# ---------------------------------------------------------------------------------------------- settings


def test_settings_need_a_strong_secret():
    with pytest.raises(GatewaySettingsError, match="GROVE_GATEWAY_SECRET"):
        GatewaySettings.from_env({})
    with pytest.raises(GatewaySettingsError, match="fewer than 16"):
        GatewaySettings.from_env({"GROVE_GATEWAY_SECRET": "short"})
    s = GatewaySettings.from_env({"GROVE_GATEWAY_SECRET": SECRET, "GROVE_STORE": "/tmp/x"}, model_name="tiny")
    assert (s.store, s.model_name, s.secret.get_secret_value()) == ("/tmp/x", "tiny", SECRET)
    assert SECRET not in repr(s)


# ---------------------------------------------------------------------------------------------- HTTP


@pytest.fixture
def bare_app() -> FastAPI:
    """The app without its lifespan: no Temporal client, no store. A request that got past auth and
    validation to the workflow would fail for lack of them."""
    settings = GatewaySettings(
        temporal_address="127.0.0.1:1", store="/nonexistent", secret=SECRET, model_name="m"
    )
    app = create_app(settings)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    return app


async def call(app: FastAPI, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        return await c.request(method, path, **kw)


async def test_unexpected_errors_are_json_500_without_internals(bare_app):
    r = await call(bare_app, "GET", "/boom")
    assert r.status_code == 500 and r.json()["error"]["code"] == "InternalError"
    assert "passwd" not in r.text and "Traceback" not in r.text


async def test_auth_and_validation_answer_before_any_workflow(bare_app):
    path = f"/episodes/{episode_ref('ep/1')}/v1/chat/completions"
    ok = {"authorization": f"Bearer {issue_token(SECRET, 'ep/1')}"}
    r = await call(bare_app, "POST", path, json={"model": "m", "messages": [USER]})
    assert (r.status_code, r.json()["error"]["type"]) == (401, "authentication_error")
    r = await call(
        bare_app,
        "POST",
        path,
        json={"model": "m", "messages": [USER]},
        headers={"authorization": f"Bearer {issue_token(SECRET, 'ep/2')}"},
    )
    assert (r.status_code, r.json()["error"]["type"]) == (403, "permission_error")
    r = await call(bare_app, "POST", path, content=b"[", headers=ok)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "InvalidChatRequestError")
    r = await call(bare_app, "POST", "/episodes/not=valid/v1/chat/completions", json={}, headers=ok)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "InvalidEpisodeRefError")
    r = await call(bare_app, "GET", f"/episodes/{episode_ref('ep/1')}/v1/models", headers=ok)
    assert r.json()["data"][0]["id"] == "m"
    r = await call(bare_app, "GET", "/healthz")
    assert r.json() == {"status": "ok"}


async def test_a_bad_responses_request_is_refused_in_its_shape_before_the_episode(bare_app):
    """POST /v1/responses (Codex, the Agents SDK's default model): the token is checked first, then the
    body; the real openai client reads the refusal (no Temporal behind this app: nothing got further)."""
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}
    async with openai_client(bare_app, issue_token(SECRET, "ep/1")) as client:
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model="m", input=[reasoning])
    error = err.value.body
    assert (error["code"], error["param"]) == ("UnsupportedInputItemError", "input[0].type")
    assert "reasoning" in error["message"]
    async with openai_client(bare_app, "sk-x") as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.responses.create(model="m", input="hi")


@contextlib.asynccontextmanager
async def openai_client(app: FastAPI, api_key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The real openai client talking to `app` in process, on episode ep/1's base URL, no retries."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport) as http_client:
        yield openai.AsyncOpenAI(
            base_url=f"http://gw/episodes/{episode_ref('ep/1')}/v1",
            api_key=api_key,
            http_client=http_client,
            max_retries=0,
        )


async def test_a_streamed_responses_request_is_refused_before_any_stream(bare_app):
    """`stream: true` with a bad body gets the same refusal as a plain one, as a JSON error before any
    server-sent event (a harness reading the stream sees the status, never a half stream)."""
    async with openai_client(bare_app, issue_token(SECRET, "ep/1")) as client:
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model="m", input="hi", stream=True, tools=[{"type": "web_search"}])
    assert err.value.response.headers["content-type"].startswith("application/json")
    assert (err.value.body["code"], err.value.body["param"]) == ("UnsupportedToolError", "tools[0].type")


async def test_the_agents_sdk_default_model_request_is_taken(bare_app):
    """The real OpenAI Agents SDK with its default model (the Responses API) and a function tool (strict,
    as the SDK makes them): the body it sends passes the Responses checks (gateway/intake/body_parse.py
    check_responses_body) and reads as the chat messages and tool the policy would see."""
    import agents  # the `harnesses` extra (infra/bootstrap.sh installs it)

    from gateway.intake.body_parse import check_responses_body
    from gateway.intake.limits import RequestLimits

    agents.set_tracing_disabled(True)
    sent: list[bytes] = []

    async def keep(request: httpx.Request) -> None:
        sent.append(request.content)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    transport = httpx.ASGITransport(app=bare_app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, event_hooks={"request": [keep]}) as http_client:
        client = openai.AsyncOpenAI(
            base_url=f"http://gw/episodes/{episode_ref('ep/1')}/v1", api_key=issue_token(SECRET, "ep/1"),
            http_client=http_client, max_retries=0,
        )  # fmt: skip
        tutor = agents.Agent(
            name="Math Tutor", instructions="Answer.", tools=[add],
            model=agents.OpenAIResponsesModel(model="m", openai_client=client),
        )  # fmt: skip
        with pytest.raises(openai.APIStatusError):  # past the checks: this app has no Temporal behind it
            await agents.Runner.run(tutor, "What is 2 + 2?")
    accepted = check_responses_body(sent[0], RequestLimits(), "m", 1024)
    assert accepted.form.messages == [
        {"role": "system", "content": "Answer."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    [tool] = accepted.form.tools or []
    assert tool["function"]["name"] == "add" and tool["function"]["description"] == "Add two numbers."
