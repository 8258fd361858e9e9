"""A tool_use the policy generated, through the Anthropic Messages API and back, spliced exactly: real
services on a stack of this module's own (its Temporal dev server, a vLLM engine on the tool-call model,
which answers this module's request with a well-formed hermes tool call: tests/gateway/tool_call_model.py,
the gateway and an in-process grove worker), because the session's worker serves the tiny-random model,
which never writes one.

What each call was is read from the engine (`RecordingEngine.served`), what the episode admitted from
the workflow, and the row from the closed episode's parquet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator

import anthropic
import numpy as np
import pytest
from transformers import AutoTokenizer

from activities.engine_config import EngineConfig
from cli.worker import run_worker
from gateway.http.app import create_app
from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from gateway.http.settings import GatewaySettings
from grove import queues
from grove.client import connect
from grove.contracts import EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from infra.temporal import TemporalDevServer
from storage.local import LocalStore
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.fixtures.models import build_in_fresh_interpreter
from tests.fixtures.worker import RecordingEngine
from tests.gateway.test_app_e2e import SECRET, close, serving
from tests.gateway.tool_call_model import ASKED, WEATHER
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

MODEL = "grove-tool-call"
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    """This module's own Temporal dev server: beside the session's worker (tiny-random), a second worker
    of grove's queues on one server would take each other's tasks."""
    server = TemporalDevServer(tmp_path_factory.mktemp("anthropic-temporal")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def stack(tools_server, tmp_path_factory) -> AsyncIterator[tuple]:
    model_dir = await asyncio.to_thread(
        build_in_fresh_interpreter, "tests.gateway.tool_call_model", "ensure_tool_call_model"
    )
    client = await connect(tools_server.address)
    engine = await RecordingEngine.start(EngineConfig(model_dir=model_dir, max_model_len=MAX_MODEL_LEN))
    engine.served = []
    tmp = tmp_path_factory.mktemp("anthropic-tools")
    store = LocalStore(tmp / "store")
    settings = GatewaySettings(
        temporal_address=tools_server.address, store=str(store.root), secret=SECRET, model_name=MODEL,
        policy_model=str(model_dir), max_model_len=MAX_MODEL_LEN,
    )  # fmt: skip
    try:
        async with serving(create_app(settings)) as url:
            names = [q for q in queues.ALL if q != queues.HARNESS]
            worker = asyncio.create_task(
                run_worker(
                    client,
                    names,
                    store=store,
                    model=str(model_dir),
                    work_dir=tmp / "worker",
                    device="cpu",
                    engine=engine,
                )  # fmt: skip
            )
            try:
                yield client, engine, store, url, model_dir
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await worker
    finally:
        await engine.shutdown()


async def start_episode(client, name: str) -> str:
    """An external episode with a fixed id (so fixed sampling seeds)."""
    run = f"at-{name}"
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=64),
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


def claude(url: str, episode_id: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{url}/episodes/{episode_ref(episode_id)}",
        api_key=issue_token(SECRET, episode_id),
        max_retries=0,
    )


async def test_a_generated_tool_use_comes_back_as_generated_and_its_result_continues_exactly(stack):
    client, engine, store, url, model_dir = stack
    asked = ASKED
    eid = await start_episode(client, "tool")
    async with claude(url, eid).messages.stream(
        model=MODEL, max_tokens=64, messages=asked, tools=[WEATHER], extra_body={"temperature": 0.7}
    ) as stream:
        first = await stream.get_final_message()
    assert first.stop_reason == "tool_use", first.content
    served = engine.calls_of(eid)["parent.0.c0"]
    [tool_use] = [b for b in first.content if b.type == "tool_use"]
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "Paris"})  # the model's script
    # what the engine sampled, decoded here: its tool-call block carries this name and these arguments
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    completion = tokenizer.decode(served.completion_ids.tolist())
    block = json.loads(re.search(r"<tool_call>(.*?)</tool_call>", completion, re.DOTALL).group(1))
    assert (block["name"], block["arguments"]) == (tool_use.name, tool_use.input)
    assert first.usage.output_tokens == served.completion_ids.size

    # The harness runs the tool and re-sends the turn: tool_use as it got it (input re-serialised by the
    # SDK), then its result. The policy's generated tokens are spliced: the next prompt extends them.
    turn = [
        *asked,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}],
        },
    ]
    second = await claude(url, eid).messages.create(
        model=MODEL, max_tokens=16, messages=turn, tools=[WEATHER]
    )
    calls = engine.calls_of(eid)
    parent, child = calls["parent.0.c0"], calls["parent.0.c1"]
    prefix = np.concatenate([parent.prompt_ids, parent.completion_ids])
    assert np.array_equal(child.prompt_ids[: prefix.size], prefix) and child.prompt_ids.size > prefix.size
    assert second.usage.input_tokens == child.prompt_ids.size

    r = await close(url, eid, {"final_answer": "sunny"}, wait=True)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 2}
    [row] = rows_from_parquet(store.get(result["rows_key"]))
    np.testing.assert_array_equal(row.input_ids, np.concatenate([child.prompt_ids, child.completion_ids]))
