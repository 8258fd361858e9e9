"""A real policy that plays one scripted Agents SDK episode, for the streamed-run tests
(tests/harnesses/test_agents_sdk_stream_e2e.py): the pretrained `tiny` model fine-tuned until its replies
to the requests of the program below are fixed texts. vLLM serves it like any model; its replies are
genuinely sampled tokens with the engine's logprobs (as tests/harnesses/script_model.py does for OpenCode).

Why: the tiny models never write a parseable tool call on their own, and the streamed-run test must see a
tool call arrive in the stream and the SDK run the worker tool (a nested run) from it. The script:

- the lead (its worker agent offered as the tool `worker`), asked `Words: red cat` -> two `worker`
  calls in one response, `{"input": "red"}` and `{"input": "cat"}` (the SDK runs them concurrently);
- the worker asked `red` -> `red`; asked `cat` -> `cat`;
- the lead's resumption with both tool results -> `red cat`;
- a second program, a front desk with a handoff to a specialist, asked `Route: sun` -> the handoff call
  `transfer_to_billing_specialist` (`{}`); the specialist, on the history the SDK hands it (the request,
  the handoff call and its output) -> `sun`. The handoff tests (plain, streamed, Temporal-native) run it;
- a third program, a concierge (the run's starting agent) with a handoff to a porter who has a handoff
  back, asked `Carry: bag` -> `transfer_to_porter`; the porter -> `transfer_to_concierge`; the concierge
  handed back to, on the whole history -> `bag`. The hand-back tests (plain, streamed) run it;
- beside the programs, one Anthropic Messages request offering `get_weather` -> the call
  `get_weather({"city": "Paris"})` (tests/gateway/weather_call.py), for the tool_use round trip
  (tests/gateway/test_anthropic_tools_e2e.py), which then shares this model's stack.

The training prompts are what the gateway will render for those requests: the request bodies are the
ones the SDK itself sends (captured by running the program once against a scripted in-memory
transport), rendered with the gateway's renderer; the resumption's prompt is the exact splice of the
lead's first prompt, its scripted completion and the rendered tool results (chat/render.py).

Built once per machine into the model cache (models/registry.py's locking and atomic publish) and checked
right after training: greedy replies to every scripted prompt must be the script.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

from tests.gateway.weather_call import SCRIPT as WEATHER_SCRIPT
from tests.gateway.weather_call import weather_example

VERSION = "agents-stream-4"  # 4: the Anthropic weather call
BASE = "tiny"
WORDS = ("red", "cat")
USER = "Words: " + " ".join(WORDS)
LEAD_INSTRUCTIONS = "You lead. Send each word to the worker tool, then answer with the words."
WORKER_INSTRUCTIONS = "Reply with the word you are given."
LEAD_NAME, WORKER_NAME = "Stream lead", "Stream worker"  # spaces: the provider makes them header-safe
WORKER_TOOL = "worker"
FRONT_NAME, SPECIALIST_NAME = "Front desk", "Billing specialist"
FRONT_INSTRUCTIONS = "You route each request to the specialist."
SPECIALIST_INSTRUCTIONS = "Reply with the word in the request."
ROUTE_WORD = "sun"
ROUTE_USER = f"Route: {ROUTE_WORD}"
HANDOFF_TOOL = "transfer_to_billing_specialist"  # the SDK's default tool name for SPECIALIST_NAME
CONCIERGE_NAME, PORTER_NAME = "Concierge", "Porter"
CONCIERGE_INSTRUCTIONS = "You pass each request to the porter and answer when it comes back."
PORTER_INSTRUCTIONS = "You hand every request back to the concierge."
CARRY_WORD = "bag"
CARRY_USER = f"Carry: {CARRY_WORD}"
TO_PORTER, TO_CONCIERGE = "transfer_to_porter", "transfer_to_concierge"  # the SDK's default tool names
# the loss is below 1e-3 by step 50 (greedy replies are the script well before): 60 steps, not 120
STEPS, LR = 60, 3e-3


def script_settings() -> Any:
    """How the tests sample the script model: its tokens lead the others by a wide margin after
    training; at temperature 0.3 a deviation is negligible."""
    from agents import ModelSettings

    return ModelSettings(temperature=0.3, max_tokens=64)


class AgentsScriptModelError(RuntimeError):
    """The fine-tuned model does not reply with its script."""


def lead_agent(settings: Any = None, on_stream: Any = None) -> Any:
    """The program's lead: the worker agent as its tool (`on_stream`: the nested run is streamed too)."""
    from agents import Agent, ModelSettings

    settings = settings or ModelSettings()
    worker = Agent(name=WORKER_NAME, instructions=WORKER_INSTRUCTIONS, model_settings=settings)
    tool = worker.as_tool(
        tool_name=WORKER_TOOL, tool_description="Repeats the word it is given.", on_stream=on_stream
    )
    return Agent(name=LEAD_NAME, instructions=LEAD_INSTRUCTIONS, tools=[tool], model_settings=settings)


def front_desk(settings: Any = None) -> Any:
    """The handoff program's first agent: no tools, one handoff (to the specialist)."""
    from agents import Agent, ModelSettings

    settings = settings or ModelSettings()
    specialist = Agent(name=SPECIALIST_NAME, instructions=SPECIALIST_INSTRUCTIONS, model_settings=settings)
    return Agent(
        name=FRONT_NAME, instructions=FRONT_INSTRUCTIONS, handoffs=[specialist], model_settings=settings
    )


def concierge() -> Any:
    """The hand-back program's starting agent: one handoff, to a porter whose one handoff is back to it."""
    from agents import Agent

    settings = script_settings()
    porter = Agent(name=PORTER_NAME, instructions=PORTER_INSTRUCTIONS, model_settings=settings)
    desk = Agent(
        name=CONCIERGE_NAME, instructions=CONCIERGE_INSTRUCTIONS, handoffs=[porter], model_settings=settings
    )
    porter.handoffs = [desk]
    return desk


def handoff_message(tool: str = HANDOFF_TOOL) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": tool, "arguments": {}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def tool_call_message(words: tuple[str, ...] = WORDS) -> dict[str, Any]:
    calls = [
        {"type": "function", "function": {"name": WORKER_TOOL, "arguments": {"input": w}}} for w in words
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _scripted_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The script as a chat.completion message for a captured request."""
    system = body["messages"][0]["content"]
    if system.startswith(FRONT_INSTRUCTIONS):
        call = {"id": "call_h", "type": "function", "function": {"name": HANDOFF_TOOL, "arguments": "{}"}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if system.startswith(SPECIALIST_INSTRUCTIONS):
        return {"role": "assistant", "content": ROUTE_WORD}
    if system.startswith(PORTER_INSTRUCTIONS):
        return _handoff_reply(TO_CONCIERGE)
    if system.startswith(CONCIERGE_INSTRUCTIONS):
        handed_back = any(
            c["function"]["name"] == TO_CONCIERGE for m in body["messages"] for c in m.get("tool_calls") or ()
        )
        return {"role": "assistant", "content": CARRY_WORD} if handed_back else _handoff_reply(TO_PORTER)
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"role": "assistant", "content": " ".join(WORDS)}
    if body.get("tools"):
        calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": WORKER_TOOL, "arguments": json.dumps({"input": w})},
            }
            for i, w in enumerate(WORDS)
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": last["content"]}


def _handoff_reply(tool: str) -> dict[str, Any]:
    call = {"id": f"call_{tool}", "type": "function", "function": {"name": tool, "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def capture_requests() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The chat-completions bodies the programs send, in order: lead, two workers, lead again; then
    the front desk and the specialist it hands off to; then the concierge, the porter, the concierge."""
    import httpx
    from agents import OpenAIChatCompletionsModel, RunConfig, Runner
    from openai import AsyncOpenAI

    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        message = _scripted_reply(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{len(bodies)}", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )  # fmt: skip

    async def run(agent: Any, user: str) -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        client = AsyncOpenAI(base_url="http://script/v1", api_key="x", http_client=http, max_retries=0)
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        await Runner.run(agent, user, run_config=RunConfig(model=model, tracing_disabled=True))

    asyncio.run(run(lead_agent(), USER))
    asyncio.run(run(front_desk(), ROUTE_USER))
    asyncio.run(run(concierge(), CARRY_USER))
    if len(bodies) != 9:
        raise AgentsScriptModelError(f"the programs sent {len(bodies)} requests, expected 4 + 2 + 3")
    return bodies[:4], bodies[4:6], bodies[6:]


def examples(tok: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of every scripted request, as the gateway renders the prompts."""
    from chat.content_tokens import encode
    from chat.render import Predecessor, assistant_turn_text, render_chat, render_root

    end = tok.convert_tokens_to_ids("<|im_end|>")

    def reply(message: dict[str, Any], tools: Any) -> list[int]:
        return [*encode(tok, assistant_turn_text(tok, message, tools)), end]

    (lead, *workers, resume), (front, specialist), carry = capture_requests()
    tools = lead.get("tools")
    lead_prompt = render_root(tok, lead["messages"], tools)
    lead_reply = reply(tool_call_message(), tools)
    out = [(lead_prompt, lead_reply)]
    for body in workers:
        word = body["messages"][-1]["content"]
        out.append((render_root(tok, body["messages"]), reply({"role": "assistant", "content": word}, None)))
    pred = Predecessor(lead["messages"], lead_prompt, lead_reply, tools)
    resumed = render_chat(tok, resume["messages"], resume.get("tools"), pred)
    if not resumed.continuation:
        raise AgentsScriptModelError("the lead's resumption does not continue its first call")
    out.append((resumed.prompt_ids, reply({"role": "assistant", "content": " ".join(WORDS)}, tools)))
    front_tools = front.get("tools")
    out.append((render_root(tok, front["messages"], front_tools), reply(handoff_message(), front_tools)))
    word = reply({"role": "assistant", "content": ROUTE_WORD}, None)
    out.append((render_root(tok, specialist["messages"], specialist.get("tools")), word))
    return [*out, *hand_back_examples(tok, carry, reply), weather_example(tok)]


def hand_back_examples(
    tok: Any, carry: list[dict[str, Any]], reply: Any
) -> list[tuple[list[int], list[int]]]:  # noqa: E501
    """The concierge's handoff, the porter's handoff back, and the concierge's answer. Its last request
    holds the porter's assistant turn, so it extends none of the concierge's calls: a fresh context's
    prompt (the generation guard below says so if a renderer ever made it a continuation)."""
    from chat.render import Predecessor, UndeclaredDiscontinuityError, render_chat, render_root

    first, porter, back = carry
    tools = first.get("tools")
    first_prompt = render_root(tok, first["messages"], tools)
    first_reply = reply(handoff_message(TO_PORTER), tools)
    out = [(first_prompt, first_reply)]
    porter_tools = porter.get("tools")
    back_call = reply(handoff_message(TO_CONCIERGE), porter_tools)
    out.append((render_root(tok, porter["messages"], porter_tools), back_call))
    answer = reply({"role": "assistant", "content": CARRY_WORD}, tools)
    pred = Predecessor(first["messages"], first_prompt, first_reply, tools)
    try:
        render_chat(tok, back["messages"], back.get("tools"), pred)
    except UndeclaredDiscontinuityError:
        return [*out, (render_root(tok, back["messages"], back.get("tools")), answer)]
    raise AgentsScriptModelError("the concierge handed back continues its first call; the script expects not")


def fingerprint(base_dir: Path) -> str:
    h = hashlib.sha256(VERSION.encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    script = [WORDS, USER, LEAD_INSTRUCTIONS, WORKER_INSTRUCTIONS, STEPS, LR]
    script += [FRONT_NAME, SPECIALIST_NAME, FRONT_INSTRUCTIONS, SPECIALIST_INSTRUCTIONS, ROUTE_USER]
    script += [CONCIERGE_NAME, PORTER_NAME, CONCIERGE_INSTRUCTIONS, PORTER_INSTRUCTIONS, CARRY_USER]
    script += [WEATHER_SCRIPT]
    h.update(json.dumps(script).encode())
    return h.hexdigest()[:16]


def build(out: Path, base_dir: Path) -> None:
    from transformers import AutoTokenizer

    from models.manifest import write_manifest
    from tests.harnesses.scripted_tune import Example, fine_tune

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    batch = [([*prompt, *reply], len(prompt)) for prompt, reply in examples(tok)]

    def next_batch(rng: random.Random) -> list[Example]:  # every example, in a new order each step
        rng.shuffle(batch)
        return batch

    loss = fine_tune(base_dir, out, next_batch, steps=STEPS, lr=LR, label="agents script model")
    check(out)
    write_manifest(out, {"fingerprint": fingerprint(base_dir), "base": str(base_dir), "final_loss": loss})


def check(model_dir: Path) -> None:
    """Greedy replies to every scripted prompt must be the script, end of turn included."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for prompt, want in examples(tok):
        with torch.no_grad():
            got = model.generate(
                torch.tensor([prompt]), max_new_tokens=len(want), do_sample=False, eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()  # fmt: skip
        if got != want:
            raise AgentsScriptModelError(
                f"agents script model {model_dir}: replied {tok.decode(got)!r}, not {tok.decode(want)!r}"
            )


def ensure_agents_script_model() -> Path:
    from models.registry import _ensure_cached, ensure_model, models_cache_dir

    base = ensure_model(BASE)
    return _ensure_cached(
        models_cache_dir(), "test-agents-script", fingerprint(base), lambda out: build(out, base)
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(ensure_agents_script_model())
