"""Large chat bodies decoded and checked in a worker process (gateway/intake/body_parse.py): the same refusals
the event loop gives a small body, the lower bound's refusal without sending the request back, and a worker
that dies answered with 503 and replaced.

A real spawned pool and the tiny model's real tokenizer (for the bound). The worker is killed while a
test gate (grove/gates.py, point `body_parse`) holds it, so the kill happens mid-decode by construction.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from transformers import AutoTokenizer

from gateway.intake.body_parse import BodyParser, BodyWorkerLostError, check_responses_body
from gateway.intake.chat_request import InvalidChatRequestError, UnsupportedParameterError
from gateway.intake.context_window import ContextLengthExceededError, MaxTokensOverContextError
from gateway.intake.limits import InvalidJsonError, RequestLimits, TooManyItemsError
from gateway.intake.previous_response import response_id
from gateway.intake.responses_chat import AcceptedResponses
from gateway.intake.tokenization import PromptBound
from grove.gates import ENV as GATES_ENV
from grove.gates import GateControl
from tests.bounds import STATE_WAIT

MODEL = "m"
CONTEXT = 1024
LIMITS = RequestLimits(max_messages=8)


def raw(messages: list, **extra) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages, **extra}).encode()


@pytest.fixture(scope="module")
def bound(tiny_model_dir) -> PromptBound:
    found = PromptBound.of(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    assert found is not None
    return found


@pytest.fixture
async def parser(bound, tmp_path, monkeypatch):
    monkeypatch.setenv(GATES_ENV, str(tmp_path))  # the spawned worker inherits it
    parser = BodyParser(processes=1, retry_after=2)
    parser.bound = bound
    yield parser, GateControl(tmp_path)
    await asyncio.to_thread(parser.shutdown)


async def parse(parser: BodyParser, body: bytes):
    return await parser.parse("ep", body, LIMITS, MODEL, CONTEXT)


async def test_a_valid_large_body_comes_back_as_the_validated_request(parser):
    parser, _ = parser
    text = "the quick brown fox " * 5000  # 100 KB, as an assistant turn: the bound does not count it
    request = await parse(
        parser, raw([{"role": "assistant", "content": text}, {"role": "user", "content": "hi"}])
    )
    assert request.messages[0]["content"] == text and request.messages[1] == {"role": "user", "content": "hi"}
    assert request.model == MODEL and request.max_tokens is None


async def test_an_over_long_prompt_comes_back_as_the_lower_bounds_refusal_not_the_request(parser):
    parser, _ = parser
    refusal = await parse(parser, raw([{"role": "user", "content": "x" * 3_900_000}]))
    assert isinstance(refusal, ContextLengthExceededError) and refusal.param == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in str(refusal) and "at least" in str(refusal)


async def test_a_large_chained_responses_body_comes_back_waiting_for_its_history(parser):
    """A Responses body naming a previous response is checked in the worker on its own items (an output of
    a call only the previous response holds is not refused there), its bound on them alone; it comes back
    pending: the gateway reads the history before capture (gateway/pipeline/previous_response.py)."""
    parser, _ = parser
    rid = response_id("ep", "parent.0.c0")
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok " * 100}
    body = json.dumps({"model": MODEL, "input": [output], "previous_response_id": rid}).encode()
    request = await parser.parse("ep", body, LIMITS, MODEL, CONTEXT, check_responses_body)
    assert isinstance(request, AcceptedResponses) and request.pending
    assert request.form.messages == [{"role": "tool", "tool_call_id": "call_1", "content": "ok " * 100}]
    over = {"type": "message", "role": "user", "content": "x" * 3_900_000}
    body = json.dumps({"model": MODEL, "input": [over], "previous_response_id": rid}).encode()
    refusal = await parser.parse("ep", body, LIMITS, MODEL, CONTEXT, check_responses_body)
    assert isinstance(refusal, ContextLengthExceededError)


@pytest.mark.parametrize(
    ("body", "error", "param", "says"),
    [
        (b'{"model": "m", "messages": [', InvalidChatRequestError, None, "not valid JSON"),
        (raw([{"role": "user", "content": "ok \ud800"}]), InvalidJsonError, "messages[0].content", "U+D800"),
        (raw([{"role": "user", "content": "x"}] * 9), TooManyItemsError, "messages", "max_messages = 8"),
        (raw([{"role": "user", "content": "x"}], seed=1), UnsupportedParameterError, "seed", "seed=1"),
        (raw([{"role": "user", "content": "x"}], max_tokens=CONTEXT), MaxTokensOverContextError, "max_tokens",
         f"max_model_len = {CONTEXT}"),
    ],
)  # fmt: skip
async def test_each_refusal_comes_back_with_its_class_param_and_message(parser, body, error, param, says):
    parser, _ = parser
    with pytest.raises(Exception) as refused:
        await parse(parser, body)
    assert type(refused.value) is error and refused.value.param == param
    assert says in str(refused.value)


async def test_a_worker_killed_mid_decode_is_a_503_and_the_next_body_gets_a_new_worker(parser):
    parser, gates = parser
    gates.arm("body_parse", "^ep$")
    decoding = asyncio.create_task(parse(parser, raw([{"role": "user", "content": "hi"}])))
    async with asyncio.timeout(STATE_WAIT):  # the worker starts with the first body
        while not gates.held("body_parse"):
            assert not decoding.done(), decoding.result()
            await asyncio.sleep(0.05)
    pid = gates.holder("body_parse", "ep")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(BodyWorkerLostError) as lost:
        await decoding
    assert lost.value.retry_after == 2 and "'ep'" in str(lost.value) and "died" in str(lost.value)
    gates.disarm("body_parse")
    request = await parse(parser, raw([{"role": "user", "content": "again"}]))
    assert request.messages == [{"role": "user", "content": "again"}]
