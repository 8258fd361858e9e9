"""Size and shape limits at the gateway, on the real FastAPI app without its
lifespan: no Temporal client, no store, no tokenizer. A request that got past the limits would reach
the missing capture service and fail with a 500, so every 4xx below was answered before anything
could be admitted (the e2e module shows the same against a real episode: nothing admitted).

Bodies are streamed by a generator that counts what the app pulled, so "not read into memory" is
measured, not assumed.
"""

from __future__ import annotations

import json

import httpx
import pytest

from capture.records import ChatRecord, Usage, save_record
from gateway.http.app import create_app
from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from gateway.http.settings import DEFAULT_MAX_MODEL_LEN, GatewaySettings
from gateway.intake.limits import RequestLimits
from gateway.pipeline.identity import MAX_ID_CHARS, InvalidIdentityHeaderError, check_headers
from grove.store_layout import staged_receipt_key, staging_key
from storage.local import LocalStore

SECRET = "limits-test-secret-0123456789"
EPISODE = "run/s000001/t0/g0"
MODEL = "m"
USER = {"role": "user", "content": "hi"}
MiB = 2**20
CHUNK = 64 * 1024
LIMITS = RequestLimits(max_body_bytes=MiB, max_close_bytes=64 * 1024, max_messages=8, max_json_depth=32)


@pytest.fixture
def app():
    settings = GatewaySettings(
        temporal_address="127.0.0.1:1",
        store="/nonexistent",
        secret=SECRET,
        model_name=MODEL,
        max_model_len=1024,
        limits=LIMITS,
    )
    return create_app(settings)


AUTH = {"authorization": f"Bearer {issue_token(SECRET, EPISODE)}"}
CHAT = f"/episodes/{episode_ref(EPISODE)}/v1/chat/completions"
CLOSE = f"/episodes/{episode_ref(EPISODE)}/close"


class CountingBody:
    """An async body of `total` bytes in CHUNK pieces that records how many bytes were pulled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.pulled = 0

    async def __aiter__(self):
        while self.pulled < self.total:
            n = min(CHUNK, self.total - self.pulled)
            self.pulled += n
            yield b" " * n


async def send(app, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        return await c.request(method, path, **kw)


def error(r: httpx.Response) -> dict:
    return r.json()["error"]


def chat(messages: list, **extra) -> dict:
    return {"model": MODEL, "messages": messages, **extra}


# ---------------------------------------------------------------------------------------------- bodies


@pytest.mark.parametrize("path", [CLOSE, CHAT])
async def test_a_100mb_body_without_a_token_is_refused_before_it_is_read(app, path):
    body = CountingBody(100 * MiB)
    r = await send(app, "POST", path, content=body)  # chunked: no Content-Length to go by
    assert r.status_code == 401 and error(r)["code"] == "MissingTokenError"
    assert body.pulled <= CHUNK  # main read all 100 MB of /close before checking the token


@pytest.mark.parametrize(
    ("path", "setting", "cap"), [(CLOSE, "max_close_bytes", 64 * 1024), (CHAT, "max_body_bytes", MiB)]
)
async def test_an_authorized_body_is_read_only_up_to_its_cap(app, path, setting, cap):
    body = CountingBody(100 * MiB)
    r = await send(app, "POST", path, content=body, headers=AUTH)
    assert r.status_code == 413 and error(r)["code"] == "RequestTooLargeError"
    assert error(r)["param"] == setting and f"{setting} = {cap}" in error(r)["message"]
    assert body.pulled <= cap + CHUNK


async def test_a_declared_content_length_over_the_cap_is_refused_without_reading(app):
    body = CountingBody(2 * MiB)
    r = await send(app, "POST", CHAT, content=body, headers={**AUTH, "content-length": str(2 * MiB)})
    assert r.status_code == 413 and "declares 2097152 bytes" in error(r)["message"]
    assert body.pulled == 0


async def test_a_large_body_gets_the_same_answers_from_the_body_worker(app):
    # over `bodies.large_from` (64 KiB): decoded and checked in a worker process, not on the event loop
    pad = {"role": "assistant", "content": "p" * 70_000}
    try:
        r = await send(app, "POST", CHAT, json=chat([pad] + [USER] * 8), headers=AUTH)
        assert r.status_code == 400 and error(r)["code"] == "TooManyItemsError"
        assert (
            "the request has 9 messages" in error(r)["message"] and "max_messages = 8" in error(r)["message"]
        )
        r = await send(app, "POST", CHAT, json=chat([pad, USER], max_tokens=1024), headers=AUTH)
        assert r.status_code == 400 and error(r)["code"] == "MaxTokensOverContextError"
        r = await send(app, "POST", CHAT, json=chat([pad, USER]), headers=AUTH)
        assert r.status_code == 500  # past every limit: it reached the (missing) capture service
    finally:
        app.state.body_parser.shutdown()


async def test_an_invalid_close_body_is_a_400_naming_the_field(app):
    r = await send(app, "POST", CLOSE, json={"final_answer": ["not", "text"]}, headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "InvalidBodyError"
    assert error(r)["param"] == "final_answer"


# ---------------------------------------------------------------------------------------------- headers


async def test_too_many_headers_or_header_bytes_get_431_before_auth(app):
    many = {f"x-h{i}": "v" for i in range(101)}
    r = await send(app, "POST", CHAT, json=chat([USER]), headers=many)
    assert r.status_code == 431 and error(r)["param"] == "max_headers"
    r = await send(app, "POST", CHAT, json=chat([USER]), headers={"x-big": "v" * 40_000})
    assert r.status_code == 431 and error(r)["param"] == "max_header_bytes"
    assert "max_header_bytes = 32768" in error(r)["message"]


async def test_a_228_character_context_header_is_a_400_naming_the_limit(app):
    # 96 + 4 x 33 characters: a context id this long would reach the store as a key whose file name is too
    # long (ENAMETOOLONG, a 502 after admission), so the header's own limit refuses it first.
    context = "a" * 96 + ".bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" * 4
    assert len(context) == 228
    r = await send(app, "POST", CHAT, json=chat([USER]), headers={**AUTH, "x-grove-context": context})
    assert r.status_code == 400 and error(r)["code"] == "InvalidIdentityHeaderError"
    assert f"at most {MAX_ID_CHARS} characters" in error(r)["message"]


def test_the_longest_accepted_ids_make_object_keys_a_real_store_accepts(tmp_path):
    context = "c" * 92 + ".dddddddd" * 4  # 128 characters: accepted
    check_headers({"x-grove-context": context, "x-grove-agent": "a" * 96})
    with pytest.raises(InvalidIdentityHeaderError):
        check_headers({"x-grove-context": context + "e"})
    store = LocalStore(tmp_path)
    call_id = f"{context}.c123456789"

    store.put_if_absent(staged_receipt_key(EPISODE, call_id, "f" * 64), b"{}")
    store.put_if_absent(staging_key(EPISODE, call_id), b"x")
    record = ChatRecord(
        episode_id=EPISODE, call_id=call_id, context_id=context, agent="parent", kind="action", extends=None,
        messages=[USER], tools=None, response={"role": "assistant", "content": "x"}, finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1), policy_version=0,
    )  # fmt: skip
    save_record(store, record)


# ---------------------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("depth", [500, 200_000])
async def test_deeply_nested_json_is_a_400(app, depth):
    # 500 levels would fail in Temporal's converter after an empty context is opened (500 InternalError)
    nested = "[" * depth + "]" * depth
    raw = f'{{"model": "m", "messages": [{{"role": "user", "content": "x", "metadata": {nested}}}]}}'
    r = await send(app, "POST", CHAT, content=raw.encode(), headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "InvalidJsonError"
    assert "max_json_depth = 32" in error(r)["message"]


async def test_a_lone_surrogate_is_a_400_naming_where(app):
    raw = '{"model": "m", "messages": [{"role": "user", "content": "ok \\ud800 then"}]}'
    r = await send(app, "POST", CHAT, content=raw.encode(), headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "InvalidJsonError"
    assert error(r)["param"] == "messages[0].content" and "U+D800" in error(r)["message"]
    # a surrogate *pair* is one valid character and passes this check (it reaches the missing capture)
    raw = '{"model": "m", "messages": [{"role": "user", "content": "ok \\ud83d\\ude00"}]}'
    r = await send(app, "POST", CHAT, content=raw.encode(), headers=AUTH)
    assert r.status_code == 500


async def test_more_messages_than_the_cap_is_a_400(app):
    r = await send(app, "POST", CHAT, json=chat([USER] * 9), headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "TooManyItemsError"
    assert "max_messages = 8" in error(r)["message"]


# ---------------------------------------------------------------------------------------------- content


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
async def test_image_and_audio_parts_are_a_400_naming_message_and_part(app, part):
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "see"}, part]},
    ]
    r = await send(app, "POST", CHAT, json=chat(messages), headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "UnsupportedContentError"
    assert error(r)["param"] == "messages[1].content[1].type" and repr(part["type"]) in error(r)["message"]


# ---------------------------------------------------------------------------------------------- max_tokens


@pytest.mark.parametrize(("param", "value"), [("max_tokens", 2**64), ("max_completion_tokens", 1024)])
async def test_max_tokens_beyond_the_context_is_a_400(app, param, value):
    r = await send(app, "POST", CHAT, json=chat([USER], **{param: value}), headers=AUTH)
    assert r.status_code == 400 and error(r)["code"] == "MaxTokensOverContextError"
    assert error(r)["param"] == param and "max_model_len = 1024" in error(r)["message"]


async def test_max_tokens_that_fit_pass_the_limits(app):
    r = await send(app, "POST", CHAT, json=chat([USER], max_tokens=1023), headers=AUTH)
    assert r.status_code == 500  # past every limit: it reached the (missing) capture service


def test_the_default_context_is_the_engines_default():
    from activities.engine_config import EngineConfig

    assert EngineConfig.model_fields["max_model_len"].default == DEFAULT_MAX_MODEL_LEN


def test_limits_come_from_the_environment():
    env = {"GROVE_GATEWAY_SECRET": SECRET, "GROVE_GATEWAY_MAX_BODY_BYTES": "2048", "GROVE_STORE": "/s",
           "GROVE_GATEWAY_MAX_MODEL_LEN": "4096", "GROVE_GATEWAY_POLICY_MODEL": "smollm2"}  # fmt: skip
    settings = GatewaySettings.from_env(env)
    assert settings.limits.max_body_bytes == 2048 and settings.max_model_len == 4096
    assert settings.policy_model == "smollm2"
    assert json.loads(settings.limits.model_dump_json())["max_close_bytes"] == 256 * 1024


def test_temperature_above_the_engines_maximum_is_refused():
    # vLLM refuses temperature > 2: a request above it must be refused before admission, not fail there (502)
    from gateway.intake.chat_request import InvalidSamplingError, parse_chat_request, sampling_for
    from grove.sampling import SamplingConfig

    request = parse_chat_request(chat([USER], temperature=3.0), MODEL)
    with pytest.raises(InvalidSamplingError, match="temperature"):
        sampling_for(request, SamplingConfig())
    assert sampling_for(parse_chat_request(chat([USER], temperature=2.0), MODEL), SamplingConfig())
