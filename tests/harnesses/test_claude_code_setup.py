"""The pure part of the Claude Code harness (harnesses/claude_code.py): its command line, environment,
setup checks, and the outcome read from `--output-format stream-json` events.

`fixtures/claude-code-two-agents.events.jsonl` and `fixtures/claude-code-background-agents.events.jsonl`
are the stdout of the real binary (@anthropic-ai/claude-code 2.1.332, launched with this module's argv and
env for `claude-code-delegation`) against a scripted Messages server that made the lead call `Agent`
twice (`Word: zorblat`, `Word: quintex`; foreground, then with run_in_background true), answered each
worker with its word and the lead with `zorblat quintex`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grove.contracts import ClaudeCodeOptions, HarnessSpec, TaskSpec
from harnesses.claude_code import (
    ClaudeCodeSetupError,
    anthropic_base_url,
    claude_argv,
    claude_env,
    outcome_of_events,
    session_id,
    setup_for,
)
from harnesses.claude_code_delegation import AGENTS, LEAD_PROMPT, make_task
from harnesses.json_events import parse_events

FIXTURES = Path(__file__).parent / "fixtures"
FOREGROUND = FIXTURES / "claude-code-two-agents.events.jsonl"
BACKGROUND = FIXTURES / "claude-code-background-agents.events.jsonl"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_command_keeps_the_agent_tool_and_never_waits_for_a_person():
    setup = setup_for(make_task(1), ClaudeCodeOptions())
    argv = claude_argv("/bin/claude", setup, model="served-model", episode_id="ep-1")
    assert argv[:5] == ["/bin/claude", "-p", "--output-format", "stream-json", "--verbose"]
    assert "--bare" not in argv  # it would drop the Agent tool
    assert "--dangerously-skip-permissions" not in argv  # refused as root; dontAsk never prompts
    assert _flag(argv, "--permission-mode") == "dontAsk"
    assert _flag(argv, "--model") == "served-model"
    assert _flag(argv, "--system-prompt") == LEAD_PROMPT
    assert _flag(argv, "--tools") == "Agent" and _flag(argv, "--allowedTools") == "Agent"
    assert _flag(argv, "--setting-sources") == "" and "--strict-mcp-config" in argv
    assert json.loads(_flag(argv, "--agents")) == AGENTS
    assert "--no-session-persistence" in argv
    w1, w2 = make_task(1).params["words"]
    assert argv[-2:] == ["--", f"Words: {w1} {w2}"]  # a message starting with '-' stays a message


def test_the_session_id_is_the_episodes_at_every_launch():
    setup = setup_for(make_task(1), ClaudeCodeOptions())
    first = _flag(claude_argv("c", setup, model="m", episode_id="ep-1"), "--session-id")
    assert first == _flag(claude_argv("c", setup, model="m", episode_id="ep-1"), "--session-id")
    assert first != session_id("ep-2")
    assert len(first) == 36 and first.count("-") == 4  # a UUID, as --session-id requires


def test_subagents_tools_are_approved_up_front_with_the_leads():
    task = TaskSpec(family="mine", task_id="t1", params={"message": "-h is a message"})
    options = ClaudeCodeOptions(
        tools=["Bash", "Agent"],
        agents={"reader": {"description": "Reads.", "prompt": "Read it.", "tools": ["Read", "Bash"]}},
    )
    argv = claude_argv("c", setup_for(task, options), model="m", episode_id="e")
    assert _flag(argv, "--tools") == "Bash,Agent"
    assert _flag(argv, "--allowedTools") == "Agent,Bash,Read"
    assert argv[-1] == "-h is a message"


def test_the_environment_is_built_from_scratch(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    env = claude_env(
        "/w/home", "http://gw/episodes/ref", "grove-tok", launch=3, max_output_tokens=48,
        request_timeout_s=900.0, max_context_tokens=4096,
    )  # fmt: skip
    assert "AWS_SECRET_ACCESS_KEY" not in env and "ANTHROPIC_API_KEY" not in env
    assert env["HOME"] == "/w/home" and env["CLAUDE_CONFIG_DIR"] == "/w/home/.claude"
    assert env["ANTHROPIC_BASE_URL"] == "http://gw/episodes/ref"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "grove-tok"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "x-grove-launch: 3"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "48" and env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "4096"
    assert env["API_TIMEOUT_MS"] == "900000"
    for switch in ("DISABLE_TELEMETRY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER"):
        assert env[switch] == "1"
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in claude_env(
        "/h", "u", "t", launch=1, max_output_tokens=1, request_timeout_s=1
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8400/episodes/abc/v1", "http://127.0.0.1:8400/episodes/abc"),
        ("http://127.0.0.1:8400/episodes/abc/v1/", "http://127.0.0.1:8400/episodes/abc"),
        ("http://127.0.0.1:8400/episodes/abc", "http://127.0.0.1:8400/episodes/abc"),
    ],
)
def test_the_base_url_is_the_episode_prefix_without_v1(given, expected):
    assert anthropic_base_url(given) == expected  # Claude Code appends /v1/messages itself


def test_a_task_without_a_message_or_with_a_malformed_agent_is_refused_by_name():
    with pytest.raises(ClaudeCodeSetupError, match=r"'t9'.*no first message.*harness.claude_code.message"):
        setup_for(TaskSpec(family="unknown", task_id="t9"), ClaudeCodeOptions())
    task = TaskSpec(family="unknown", task_id="t9", params={"message": "hi"})
    no_prompt = ClaudeCodeOptions(agents={"w": {"description": "d"}})
    with pytest.raises(ClaudeCodeSetupError, match=r"subagent 'w'.*missing \['prompt'\]"):
        setup_for(task, no_prompt)
    odd_key = ClaudeCodeOptions(agents={"w": {"description": "d", "prompt": "p", "color": "red"}})
    with pytest.raises(ClaudeCodeSetupError, match=r"unknown \['color'\]"):
        setup_for(task, odd_key)
    no_agent_tool = ClaudeCodeOptions(tools=["Bash"], agents={"w": {"description": "d", "prompt": "p"}})
    with pytest.raises(ClaudeCodeSetupError, match=r"lack 'Agent'"):
        setup_for(task, no_agent_tool)
    plain = setup_for(task, ClaudeCodeOptions())
    assert plain.message == "hi" and plain.tools == ("Agent",) and plain.agents == {}


def test_the_harness_kind_is_a_runner_kind_with_its_own_options():
    spec = HarnessSpec.model_validate({"kind": "claude-code", "claude_code": {"max_context_tokens": 4096}})
    assert spec.claude_code.version == "2.1.332" and spec.claude_code.max_context_tokens == 4096
    with pytest.raises(ValueError, match="extra"):
        HarnessSpec.model_validate({"kind": "claude-code", "claude_code": {"bare": True}})


@pytest.mark.parametrize("events", [FOREGROUND, BACKGROUND], ids=["foreground", "background"])
def test_outcome_of_a_real_run_with_two_agent_calls(events):
    outcome = outcome_of_events(parse_events(events.read_text().splitlines()))
    assert outcome.failure is None
    assert outcome.final_answer == "zorblat quintex"
    assert outcome.outputs == {"parent": ["zorblat quintex"], "worker": ["zorblat"], "worker-2": ["quintex"]}


def test_workers_are_numbered_in_the_order_the_lead_wrote_the_calls_whoever_ends_first():
    lines = FOREGROUND.read_text().splitlines()
    notices = [i for i, line in enumerate(lines) if '"subtype":"task_notification"' in line]
    assert len(notices) == 2
    lines[notices[0]], lines[notices[1]] = lines[notices[1]], lines[notices[0]]
    outcome = outcome_of_events(parse_events(lines))
    assert outcome.outputs["worker"] == ["zorblat"] and outcome.outputs["worker-2"] == ["quintex"]


def test_a_report_falls_back_to_the_foreground_hand_back_text():
    """Without notifications (or when one carries a summary, not the report), the lead's tool_result
    holds the report, each line indented by two spaces."""
    lines = [
        line for line in FOREGROUND.read_text().splitlines() if '"subtype":"task_notification"' not in line
    ]
    outcome = outcome_of_events(parse_events(lines))
    assert outcome.outputs["worker"] == ["zorblat"] and outcome.outputs["worker-2"] == ["quintex"]


def test_an_error_result_is_the_failure_and_no_result_is_one_too():
    error = {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "result": "API Error: 400",
    }
    outcome = outcome_of_events(parse_events(["noise", json.dumps(error), "{not json"]))
    assert outcome.failure == "Claude Code reported: API Error: 400"
    assert outcome.final_answer == "" and outcome.outputs == {}  # Claude Code's words, not the lead's
    assert outcome_of_events([]).failure == "Claude Code wrote no result event"
