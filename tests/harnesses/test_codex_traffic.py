"""Stock Codex CLI (the pinned @openai/codex, installed on first use by infra/codex.sh) with the config the
runner writes (harnesses/codex.py), against a scripted Responses server that parses every request with the
gateway's parser (gateway/intake/responses_request.py, responses_chat.py) and answers with the gateway's
renderer (gateway/http/responses_response.py). No Temporal, no model: what is checked is the wire.

- Codex takes the generated config (`--strict-config`), sends the launch header and the episode's token,
  and every request it sends parses; the first request without subagents stays small.
- With subagents, the lead's spawn_agent call (written back with its namespace) starts a subagent whose
  requests say so (`x-openai-subagent`), wait_agent returns its answer, and the lead's final message is
  the outcome.
- Each lead request after the first reads as the previous one's messages, that call's answer and only
  new tool/user messages (the chat path's extension rule, chat/render.py `same_message`): the history
  Codex echoes splices exactly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from capture.records import ChatRecord, Usage
from chat.render import same_message
from gateway.http.responses_response import ResponseShape, sse_events, stream_events
from gateway.intake.responses_chat import chat_form
from gateway.intake.responses_request import parse_responses_request
from grove.contracts import CodexOptions
from harnesses import codex
from harnesses.codex_install import codex_binary
from harnesses.json_events import parse_events
from harnesses.toml_text import to_toml

TOKEN = "tok-episode-7"
RUN_TIMEOUT_S = 120


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class Script:
    """The lead spawns one subagent, waits for it, answers with its word; the subagent says its word."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[dict] = []  # {"headers", "form", "response"} per request, in arrival order
        self.lead_turns = 0

    def answer(self, headers: dict, form) -> dict:
        if headers.get("x-openai-subagent"):
            return {"role": "assistant", "content": "apple"}
        with self.lock:
            turn = self.lead_turns
            self.lead_turns += 1
        if turn == 0 and "spawn_agent" in form.routes:
            return {"role": "assistant", "content": "Delegating.", "tool_calls": [
                _call("call_s", "spawn_agent", {"message": "Say the word: apple"})]}  # fmt: skip
        if turn == 1 and "wait_agent" in form.routes:
            spawned = next(m for m in form.messages if m["role"] == "tool" and "agent_id" in m["content"])
            agent = json.loads(spawned["content"])["agent_id"]
            return {"role": "assistant", "content": None, "tool_calls": [
                _call("call_w", "wait_agent", {"targets": [agent], "timeout_ms": 60000})]}  # fmt: skip
        return {"role": "assistant", "content": "apple"}


def _serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = json.loads(self.rfile.read(int(headers.get("content-length", 0))))
            form = chat_form(parse_responses_request(body, codex.MODEL))  # raises: the test sees a 500
            response = script.answer(headers, form)
            with script.lock:
                n = len(script.seen)
                script.seen.append(
                    {"path": self.path, "headers": headers, "form": form, "response": response}
                )
            record = ChatRecord(
                episode_id="ep", call_id=f"c{n}", context_id="x", agent="a", kind="action", extends=None,
                messages=form.messages, response=response, finish_reason="stop",
                usage=Usage(prompt_tokens=500, completion_tokens=9), policy_version=0,
            )  # fmt: skip
            data = "".join(
                sse_events(stream_events(record, ResponseShape(codex.MODEL, 0, form.routes)))
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run_codex(folder: Path, port: int, options: CodexOptions, message: str) -> list[dict]:
    """One `codex exec` the way the runner sets it up (config, catalog, environment, folders)."""
    binary = codex_binary(options.version)
    project, home = folder / "project", folder / "home"
    for path in (project, home / "tmp"):
        path.mkdir(parents=True)
    codex_home = codex.codex_home_for(folder)
    codex_home.mkdir(parents=True, exist_ok=True)
    catalog_path = codex_home / codex.CATALOG_FILE
    entries = codex.catalog(codex.MODEL, "Answer with one word.", 4096, shell=options.shell)
    catalog_path.write_text(json.dumps(entries))
    base_url = f"http://127.0.0.1:{port}/episodes/ref/v1"
    config = codex.codex_config(base_url, str(catalog_path), options, launch=3)
    (codex_home / codex.CONFIG_FILE).write_text(to_toml(config))
    env = codex.codex_env(str(home), str(codex_home), TOKEN)
    done = subprocess.run(
        codex.codex_argv(str(binary), message), cwd=project, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return parse_events(done.stdout.splitlines())


@pytest.fixture(scope="module", autouse=True)
def _installed():
    asyncio.run(asyncio.to_thread(codex_binary))  # installs the pinned Codex on a fresh machine


@pytest.fixture
def script():
    script = Script()
    server = _serve(script)
    script.port = server.server_address[1]
    yield script
    server.shutdown()
    server.server_close()


def test_without_subagents_one_small_request_reaches_the_episode(tmp_path, script):
    events = _run_codex(tmp_path / "ep", script.port, CodexOptions(subagents=False), "Say apple")
    assert codex.outcome_of_events(events).final_answer == "apple"
    [seen] = script.seen
    assert seen["path"] == "/episodes/ref/v1/responses"
    assert seen["headers"]["authorization"] == f"Bearer {TOKEN}" and seen["headers"]["x-grove-launch"] == "3"
    form = seen["form"]
    assert [m["role"] for m in form.messages] == ["system", "user"]
    assert (
        form.messages[0]["content"] == "Answer with one word." and form.messages[1]["content"] == "Say apple"
    )
    assert sorted(form.routes) == [
        "apply_patch",
        "exec_command",
        "write_stdin",
    ]  # no view_image, no user input
    assert form.routes["apply_patch"].kind == "custom"
    size = len(json.dumps(form.messages)) + len(json.dumps(form.tools))
    assert size < 6000, size  # Codex's default prompt is ~41k characters


def test_without_shell_only_apply_patch_is_left(tmp_path, script):
    _run_codex(tmp_path / "ep", script.port, CodexOptions(subagents=False, shell=False), "Say apple")
    [seen] = script.seen
    assert sorted(seen["form"].routes) == ["apply_patch"]


def test_a_subagent_round_trip_splices_exactly(tmp_path, script):
    events = _run_codex(tmp_path / "ep", script.port, CodexOptions(), "Delegate the word apple")
    assert codex.outcome_of_events(events).final_answer == "apple"
    subagent = [s for s in script.seen if s["headers"].get("x-openai-subagent") == "collab_spawn"]
    lead = [s for s in script.seen if "x-openai-subagent" not in s["headers"]]
    assert len(subagent) == 1 and len(lead) == 3
    assert subagent[0]["form"].messages[-1] == {"role": "user", "content": "Say the word: apple"}
    assert lead[0]["form"].routes["spawn_agent"].namespace == "multi_agent_v1"
    for before, after in zip(lead, lead[1:], strict=False):
        previous, messages = before["form"].messages, after["form"].messages
        n = len(previous)
        assert all(same_message(a, b) for a, b in zip(messages[:n], previous, strict=True))
        assert same_message(messages[n], before["response"])
        assert {m["role"] for m in messages[n + 1 :]} <= {"tool", "user"}
    waited = lead[2]["form"].messages
    assert any(m["role"] == "tool" and '"completed":"apple"' in m["content"] for m in waited)
