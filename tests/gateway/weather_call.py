"""The Anthropic Messages request that the suite's script model answers with a hermes tool call, for the
tool_use round trip (tests/gateway/test_anthropic_tools_e2e.py): `get_weather` offered, asked about
Paris, the reply `get_weather` called with `{"city": "Paris"}`. The script model
(tests/harnesses/agents_stream_model.py) is drilled on it beside the Agents SDK programs' requests.

Why a script: `tiny` never writes a parseable tool call on its own, and tiny-tools, which does, takes
~10 minutes to build; what the test checks is the gateway's handling of a generated call, not the
policy's skill. The prompt is the gateway's own rendering of the request
(gateway/intake/messages_blocks.py, chat/render.py).
"""

from __future__ import annotations

from typing import Any

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
SCRIPT = [WEATHER, ASKED, CALL]  # what the script model's fingerprint covers


def weather_example(tok: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids): the request as the gateway renders it, the tool call, <|im_end|>."""
    from chat.content_tokens import encode
    from chat.render import assistant_turn_text, render_root
    from gateway.intake.messages_blocks import chat_messages, chat_tools

    tools = chat_tools([WEATHER])
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": CALL}]}
    reply = [*encode(tok, assistant_turn_text(tok, call, tools)), tok.convert_tokens_to_ids("<|im_end|>")]
    return render_root(tok, chat_messages(None, ASKED), tools), reply
