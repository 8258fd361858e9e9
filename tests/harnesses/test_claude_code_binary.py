"""The pinned stock Claude Code binary, launched with exactly the command line and environment the
harness runner gives it (harnesses/claude_code.py), against a scripted Messages server
(tests/harnesses/messages_script.py): the lead of `claude-code-delegation` starts its two `worker`
subagents with `Agent`, each answers its word, the lead answers both words.

What it shows about the binary, which the gateway's Messages route and identity rely on: it sends only
`POST <ANTHROPIC_BASE_URL>/v1/messages?beta=true` (so the base is the episode prefix without /v1), each
with `Authorization: Bearer <episode token>` and `x-grove-launch`; subagent requests carry
`x-claude-code-agent-id`, which the lead's next tool_result names; no thinking field, max_tokens from the
run; and a relaunch of the same episode sends the same first requests. The binary is installed on first
use (infra/claude_code.sh, npm).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from grove.contracts import ClaudeCodeOptions
from harnesses import claude_code
from harnesses.claude_code_delegation import AGENTS, LEAD_PROMPT, make_task
from harnesses.claude_code_install import SCRIPT, VERSION, binary_path, claude_code_binary
from harnesses.json_events import parse_events
from tests.harnesses.messages_script import Answer, Recorded, scripted_messages

TOKEN = "grove-" + "ab" * 32
EPISODE = "claude-code-binary-test"
WORDS = ["zorblat", "quintex"]


def _is_subagent(request: Recorded) -> bool:
    return "x-claude-code-agent-id" in request.headers


def _user_text(request: Recorded) -> str:
    first = request.body["messages"][0]["content"]
    return first if isinstance(first, str) else "".join(b.get("text", "") for b in first)


def answer(request: Recorded) -> Answer:
    """Workers repeat their prompt; the lead calls Agent once per word, then answers with the words."""
    if _is_subagent(request):
        return [{"type": "text", "text": _user_text(request).strip()}], "end_turn", 50
    messages = request.body["messages"]
    returned = any(
        isinstance(m["content"], list) and any(b.get("type") == "tool_result" for b in m["content"])
        for m in messages
    )
    if returned:
        return [{"type": "text", "text": " ".join(WORDS)}], "end_turn", 200
    calls = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "Agent", "input": {
            "description": f"word {i}", "prompt": word, "subagent_type": "worker", "run_in_background": False,
        }}
        for i, word in enumerate(WORDS)
    ]  # fmt: skip
    return calls, "tool_use", 150


def _last_user_text(request: Recorded) -> str:
    last = request.body["messages"][-1]
    content = last["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def answer_near_the_limit(request: Recorded) -> Answer:
    """`answer`, but the lead's first answer reports 1,000 input tokens (near a 4,096-token context), the
    summary request gets a summary and the rewritten lead its final answer."""
    if not _is_subagent(request) and "<summary>" in _last_user_text(request):
        return (
            [{"type": "text", "text": "<summary>Two words went to two workers.</summary>"}],
            "end_turn",
            900,
        )
    if _user_text(request).startswith("This session is being continued"):
        return [{"type": "text", "text": " ".join(WORDS)}], "end_turn", 300
    blocks, stop, tokens = answer(request)
    return blocks, stop, 1000 if stop == "tool_use" else tokens


def launch(
    folder: Path, url: str, launch_number: int = 1, max_context_tokens: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """One launch as the runner does it: a wiped folder, the family's setup, the runner's argv and env."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "project").mkdir(parents=True)
    (folder / "home" / "tmp").mkdir(parents=True)
    task = make_task(0).model_copy(update={"params": {"words": WORDS}})
    setup = claude_code.setup_for(task, ClaudeCodeOptions())
    base = claude_code.anthropic_base_url(f"{url}/episodes/ep-test/v1")
    env = claude_code.claude_env(
        str(folder / "home"), base, TOKEN, launch=launch_number, max_output_tokens=77,
        request_timeout_s=900, max_context_tokens=max_context_tokens,
    )  # fmt: skip
    argv = claude_code.claude_argv(str(claude_code_binary()), setup, model="grove", episode_id=EPISODE)
    done = subprocess.run(argv, env=env, cwd=folder / "project", capture_output=True, text=True, timeout=120)
    return done.returncode, parse_events(done.stdout.splitlines())


@pytest.fixture(scope="module")
def two_launches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("claude") / "3f9a1c07d2e4b658"
    runs = []
    for number in (1, 2):
        with scripted_messages(answer) as server:
            code, events = launch(folder, server.url, number)
            runs.append((code, events, list(server.requests)))
    return runs


def test_the_lead_and_both_workers_talk_only_to_the_episodes_messages_route(two_launches):
    code, events, requests = two_launches[0]
    assert code == 0
    assert [(r.method, r.path) for r in requests] == [("POST", "/episodes/ep-test/v1/messages?beta=true")] * 4
    assert {r.headers["authorization"] for r in requests} == {f"Bearer {TOKEN}"}
    assert {r.headers["x-grove-launch"] for r in requests} == {"1"}
    assert {r.headers["x-stainless-timeout"] for r in requests} == {"900"}  # API_TIMEOUT_MS, in seconds
    lead = [r for r in requests if not _is_subagent(r)]
    workers = [r for r in requests if _is_subagent(r)]
    assert len(lead) == 2 and len(workers) == 2
    assert sorted(_user_text(w) for w in workers) == sorted(WORDS)
    ids = {w.headers["x-claude-code-agent-id"] for w in workers}
    assert len(ids) == 2
    # the lead's resumption names each worker by the id its requests carried
    results = [b for m in lead[1].body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    named = {
        line.split("agentId: ")[1].split()[0]
        for b in results
        if b.get("type") == "tool_result"
        for line in json.dumps(b["content"]).split("\\n")
        if line.startswith("agentId: ")
    }
    assert named == ids


def test_the_requests_carry_the_familys_prompt_tools_and_agents_and_no_thinking(two_launches):
    _, _, requests = two_launches[0]
    first = requests[0].body
    assert first["model"] == "grove" and first["max_tokens"] == 77 and first["stream"] is True
    assert "thinking" not in first
    assert first["system"][-1]["text"] == LEAD_PROMPT
    assert "x-anthropic-billing-header" not in json.dumps(first["system"])
    assert "Agent" in [t["name"] for t in first["tools"]]
    assert not {"Bash", "Read", "Edit", "Write"} & {t["name"] for t in first["tools"]}
    listed = json.dumps(first["messages"])
    assert f"- worker: {AGENTS['worker']['description']}" in listed
    assert "general-purpose" not in listed and "Explore" not in listed  # built-in subagents are off
    assert "Attribution" not in listed  # no commit-attribution reminder before the user's message
    worker = next(r for r in requests if _is_subagent(r)).body
    assert worker["tools"] == [] and AGENTS["worker"]["prompt"] in json.dumps(worker["system"])


def test_the_outcome_names_the_workers_after_their_type(two_launches):
    _, events, _ = two_launches[0]
    outcome = claude_code.outcome_of_events(events)
    assert outcome.failure is None
    assert outcome.final_answer == " ".join(WORDS)
    assert outcome.outputs == {"parent": [" ".join(WORDS)], "worker": [WORDS[0]], "worker-2": [WORDS[1]]}


def test_a_relaunch_sends_the_same_first_requests(two_launches):
    """Same episode, same folder: the lead's first request and each worker's request are the same bodies
    (the metadata's device id is drawn per config folder and is no part of the prompt); only the launch
    header differs."""
    (_, _, first), (code, _, second) = two_launches
    assert code == 0

    def bodies(requests: list[Recorded]) -> list[str]:
        firsts = [requests[0]] + sorted((r for r in requests if _is_subagent(r)), key=_user_text)
        return [
            json.dumps({k: v for k, v in r.body.items() if k != "metadata"}, sort_keys=True) for r in firsts
        ]

    assert bodies(first) == bodies(second)
    assert {r.headers["x-grove-launch"] for r in second} == {"2"}
    assert first[0].headers["x-claude-code-session-id"] == second[0].headers["x-claude-code-session-id"]


def test_a_small_context_makes_the_lead_compact_with_an_ordinary_messages_call(tmp_path):
    """max_context_tokens 4096 and 1,000 input tokens reported for the lead's first call: before the lead
    resumes, Claude Code sends its compaction as an ordinary `/v1/messages` call (same system and tools,
    the whole history, a last user message asking for a <summary>) and then the lead's rewritten history,
    which starts from the summary. The gateway tells them apart by their text (issue 44 item 2)."""
    with scripted_messages(answer_near_the_limit) as server:
        code, events = launch(tmp_path / "f", server.url, max_context_tokens=4096)
        requests = list(server.requests)
    assert code == 0
    lead = [r for r in requests if not _is_subagent(r)]
    assert len(lead) == 3 and len(requests) == 5
    first, summary, rewritten = lead
    assert "<summary>" in _last_user_text(summary)
    assert summary.body["system"] == first.body["system"] and summary.body["tools"] == first.body["tools"]
    assert summary.body["messages"][0] == first.body["messages"][0]  # the whole history, from the start
    assert _user_text(rewritten).startswith("This session is being continued")
    assert "Two words went to two workers." in _user_text(rewritten)
    boundaries = [e for e in events if e.get("subtype") == "compact_boundary"]
    assert len(boundaries) == 1 and boundaries[0]["compact_metadata"]["trigger"] == "auto"
    assert claude_code.outcome_of_events(events).final_answer == " ".join(WORDS)


def test_the_install_script_finds_the_pinned_install_and_prints_its_path():
    """Idempotent: with the pinned version installed (claude_code_binary above installed it if it was
    missing), the script installs nothing and prints the binary's path on its last line."""
    claude_code_binary()
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "installing" not in done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(binary_path(VERSION))
    version = subprocess.run(
        [done.stdout.strip().splitlines()[-1], "--version"], capture_output=True, text=True
    )
    assert version.stdout.split()[:1] == [VERSION]
