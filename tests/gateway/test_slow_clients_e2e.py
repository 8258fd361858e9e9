"""Slow clients cannot hold what others wait for: 8 episodes each trickling a declared 4,190,000-byte body
fill the 32 MiB large-body budget until the minimum upload rate cuts them, and then another episode's
valid 100 KB body is read; connections trickling their request head are closed by the head deadline and
their descriptors freed.

Real parts: the `python -m gateway` process (its own uvicorn, as `grove gateway` serves it; its limits at
their defaults) against the Temporal dev server, raw sockets as the slow clients. The slow clients are
made, not waited for: each sends its head and one byte of its body, then nothing more until the test
closes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from gateway.intake.limits import RequestLimits
from infra.worker_process import wait_until
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import SECRET

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

REPO = Path(__file__).resolve().parents[2]
LIMITS = RequestLimits()
DECLARED = 4_190_000  # bytes a trickling client declares: 8 of them fill the 32 MiB budget
TRICKLERS = 8
HEADS = 50  # connections that trickle their request head
ANSWERED_WITHIN = 120.0  # seconds (a bound: the defaults cut a slow client after ~10 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def gateway(temporal_server, e2e_store, tiny_model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "GROVE_GATEWAY_SECRET": SECRET, "PYTHONPATH": str(REPO)}
    args = [
        "--port", str(port), "--address", temporal_server.address, "--store", str(e2e_store.root),
        "--model-name", "grove-tiny", "--policy-model", str(tiny_model_dir), "--max-model-len", "1024",
    ]  # fmt: skip
    log = (tmp_path / "gateway.log").open("w")
    command = [sys.executable, "-m", "gateway", *args]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)

    async def serving() -> bool:
        assert process.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
        try:
            async with httpx.AsyncClient() as c:
                return (await c.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(serving, PROCESS_WAIT, "the gateway serving")
    try:
        yield port, process
    finally:
        process.kill()
        process.wait()
        log.close()


def chat_head(episode_id: str, length: int) -> bytes:
    path = f"/episodes/{episode_ref(episode_id)}/v1/chat/completions"
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {issue_token(SECRET, episode_id)}\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


async def answer_status(reader: asyncio.StreamReader) -> int | None:
    """The status of the server's answer, None when it closed the connection without one."""
    line = await reader.readline()
    return int(line.split()[1]) if line else None


async def test_trickled_bodies_are_cut_and_free_the_budget_for_another_episode(gateway):
    port, _ = gateway
    slow = []
    for i in range(TRICKLERS):  # one per episode: each holds its episode's turn and its bytes of the budget
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(chat_head(f"slow/e{i}", DECLARED) + b"{")
        await writer.drain()
        slow.append((reader, writer))
    body = json.dumps(
        {"model": "grove-tiny", "messages": [{"role": "user", "content": "x" * 100_000}]}
    ).encode()  # a valid 100 KB body: large (over 64 KiB), so it needs bytes of the budget
    token = issue_token(SECRET, "fast/e0")
    async with httpx.AsyncClient(timeout=ANSWERED_WITHIN) as c:
        r = await c.post(
            f"http://127.0.0.1:{port}/episodes/{episode_ref('fast/e0')}/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        )
    # it was read and decoded (its text alone is over the 1,024-token context: refused by the prompt's
    # lower bound), instead of waiting for the slow bodies
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    statuses = [await asyncio.wait_for(answer_status(reader), ANSWERED_WITHIN) for reader, _ in slow]
    assert statuses == [408] * TRICKLERS
    for _, writer in slow:
        writer.close()


async def test_a_body_below_the_minimum_rate_gets_408_naming_the_setting(gateway):
    port, _ = gateway
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(chat_head("slow/one", 1000) + b'{"model"')
    await writer.drain()
    head = await asyncio.wait_for(reader.read(), ANSWERED_WITHIN)  # the answer, then the server closes
    writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head[:200]
    error = json.loads(head.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "SlowUploadError" and error["param"] == "min_upload_bytes_per_s"


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_connections_trickling_their_head_are_closed_and_their_fds_freed(gateway):
    port, process = gateway
    before = open_fds(process.pid)
    conns = []
    for _ in range(HEADS):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /episodes/x/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-a: 1\r\n")
        await writer.drain()
        conns.append((reader, writer))
    for reader, _ in conns:  # the server ends each: a 408 head, then the end of the stream
        data = await asyncio.wait_for(reader.read(), ANSWERED_WITHIN)
        assert data.startswith(b"HTTP/1.1 408") or data == b"", data[:200]
    for _, writer in conns:
        writer.close()

    async def freed() -> bool:
        return open_fds(process.pid) <= before + 2

    await wait_until(freed, ANSWERED_WITHIN, "the gateway's descriptors back to what they were")
