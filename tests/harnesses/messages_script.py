"""A scripted Anthropic Messages server for tests that drive the real Claude Code binary: it records
every request (method, path, headers, JSON body) and answers each `POST .../v1/messages` from a script
function, as server-sent events in the order the Messages API sends them, and a runner's
`POST .../close` with 200. Not grove's gateway: it only
lets the harness's own behaviour (flags, headers, paths, events) be checked without one.

    with scripted_messages(answer) as server:   # answer(request) -> (blocks, stop_reason, input_tokens)
        ... ANTHROPIC_BASE_URL = server.url + "/episodes/ep"
        server.requests                          # what the harness sent
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[list[dict[str, Any]], str, int]


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any


@dataclass
class ScriptedMessages:
    url: str
    requests: list[Recorded] = field(default_factory=list)


def sse(blocks: list[dict[str, Any]], stop_reason: str, input_tokens: int, n: int) -> bytes:
    """One streamed message: message_start, each block's start/delta/stop, message_delta, message_stop."""
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {
            "id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": "grove", "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }},
    ]  # fmt: skip
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
            )
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append({"type": "content_block_start", "index": i, "content_block": start})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append({
        "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": 5},
    })  # fmt: skip
    events.append({"type": "message_stop"})
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


@contextlib.contextmanager
def scripted_messages(answer: Callable[[Recorded], Answer]) -> Iterator[ScriptedMessages]:
    """Serve on a free 127.0.0.1 port while the block runs; anything but POST .../v1/messages or
    .../close gets 404."""
    lock = threading.Lock()
    state = ScriptedMessages(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _record(self, body: Any) -> Recorded:
            seen = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with lock:
                state.requests.append(seen)
            return seen

        def _empty(self, status: int) -> None:
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self._record(None)
            self._empty(404)

        def do_GET(self) -> None:
            self._record(None)
            self._empty(404)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            seen = self._record(json.loads(raw) if raw else None)
            if self.path.endswith("/close"):  # the runner's close, as the gateway would take it
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            if "/v1/messages" not in self.path or not isinstance(seen.body, dict):
                self._empty(404)
                return
            with lock:
                n = len(state.requests)
            data = sse(*answer(seen), n)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
