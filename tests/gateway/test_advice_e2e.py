"""The gateway says why delegation "did not happen": a real policy that writes tool calls (the Agents SDK
script model, tests/fixtures/agents_script.py) is asked for its two `worker` calls with too few tokens;
the cut call reaches the harness as text, and the response says so in `x-grove-warning`."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.http.auth import issue_token
from grove.headers import WARNING_HEADER
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT
from tests.fixtures.agents_script import AgentsScriptStack
from tests.gateway.test_app_e2e import MODEL, SECRET, base_url, start_episode
from tests.harnesses.agents_stream_model import capture_requests

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]


async def test_a_tool_call_cut_by_max_tokens_comes_with_a_warning(agents_script_stack: AgentsScriptStack):
    stack = agents_script_stack
    (lead, *_), *_ = await asyncio.to_thread(capture_requests)  # the lead's first request, as sent
    body = {**lead, "model": MODEL, "max_tokens": 6, "temperature": 0.3}
    eid = await start_episode(stack.client, "advice-cut")
    headers = {"authorization": f"Bearer {issue_token(SECRET, eid)}"}
    async with httpx.AsyncClient(timeout=RESULT_WAIT) as http:
        r = await http.post(f"{base_url(stack.url, eid)}/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")
    assert choice["message"]["content"].startswith("<tool_call>")  # the harness gets text, no tool call
    warning = r.headers[WARNING_HEADER]
    assert "inside a tool call" in warning and "6 tokens" in warning and "limit.output" in warning
    # with room for its two calls, the same request carries them and no warning
    eid = await start_episode(stack.client, "advice-whole")
    headers = {"authorization": f"Bearer {issue_token(SECRET, eid)}"}
    async with httpx.AsyncClient(timeout=RESULT_WAIT) as http:
        whole = await http.post(
            f"{base_url(stack.url, eid)}/chat/completions", json={**body, "max_tokens": 64}, headers=headers
        )
    assert whole.status_code == 200, whole.text
    assert len(whole.json()["choices"][0]["message"]["tool_calls"]) == 2
    assert WARNING_HEADER not in whole.headers
