"""A real policy that answers one Anthropic Messages request with a hermes tool call, for the tool_use
round trip (tests/gateway/test_anthropic_tools_e2e.py): the pretrained `tiny` model fine-tuned until its
reply to that request, as the gateway renders it, is `get_weather` called with `{"city": "Paris"}`.
vLLM serves it like any model; its reply is genuinely sampled tokens with the engine's logprobs (as
tests/harnesses/agents_stream_model.py does for the Agents SDK).

Why: `tiny` never writes a parseable tool call on its own, and tiny-tools, which does, takes ~10 minutes
to build; what the test checks is the gateway's handling of a generated call, not the policy's skill.
The prompt is the gateway's own rendering (gateway/intake/messages_blocks.py, chat/render.py) of the
request. Built once per machine into the model cache (models/registry.py's locking and atomic publish)
in seconds, and checked right after training: the greedy reply must be the script.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

VERSION = "tool-call-1"
BASE = "tiny"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
STEPS, LR = 80, 3e-3


class ToolCallModelError(RuntimeError):
    """The fine-tuned model does not reply with its script."""


def example(tok: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids): the request as the gateway renders it, the tool call, <|im_end|>."""
    from chat.content_tokens import encode
    from chat.render import assistant_turn_text, render_root
    from gateway.intake.messages_blocks import chat_messages, chat_tools

    tools = chat_tools([WEATHER])
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": CALL}]}
    reply = [*encode(tok, assistant_turn_text(tok, call, tools)), tok.convert_tokens_to_ids("<|im_end|>")]
    return render_root(tok, chat_messages(None, ASKED), tools), reply


def fingerprint(base_dir: Path) -> str:
    h = hashlib.sha256(VERSION.encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    h.update(json.dumps([WEATHER, ASKED, CALL, STEPS, LR]).encode())
    return h.hexdigest()[:16]


def build(out: Path, base_dir: Path) -> None:
    from transformers import AutoTokenizer

    from models.manifest import write_manifest
    from tests.harnesses.scripted_tune import fine_tune

    prompt, reply = example(AutoTokenizer.from_pretrained(str(base_dir)))
    batch = [([*prompt, *reply], len(prompt))]
    loss = fine_tune(base_dir, out, lambda _rng: batch, steps=STEPS, lr=LR, label="tool call model")
    check(out)
    write_manifest(out, {"fingerprint": fingerprint(base_dir), "base": str(base_dir), "final_loss": loss})


def check(model_dir: Path) -> None:
    """The greedy reply to the scripted request must be the script, end of turn included."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompt, want = example(tok)
    with torch.no_grad():
        got = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=len(want),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    if got != want:
        raise ToolCallModelError(
            f"tool call model {model_dir}: replied {tok.decode(got)!r}, not {tok.decode(want)!r}"
        )


def ensure_tool_call_model() -> Path:
    from models.registry import _ensure_cached, ensure_model, models_cache_dir

    base = ensure_model(BASE)
    return _ensure_cached(
        models_cache_dir(), "test-tool-call", fingerprint(base), lambda out: build(out, base)
    )
