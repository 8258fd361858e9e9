"""The pure part of the Codex harness (harnesses/codex.py): its config.toml and model catalog, environment,
CODEX_HOME, command line and the outcome read from `codex exec --json` events.

`fixtures/codex-exec-spawn.events.jsonl` is the stdout of a real `codex exec --json` (@openai/codex
0.171.0) against a scripted Responses server that made the lead write a message with spawn_agent and
exec_command calls, then wait_agent, then an apply_patch, then answer "done 3".
`fixtures/codex-exec-incomplete.events.jsonl`: the same binary when the answer was cut at its token
budget (`response.incomplete`): Codex fails the turn and exits 1.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grove.contracts import CodexOptions, HarnessSpec, TaskSpec
from harnesses.codex import (
    TOKEN_ENV,
    CodexSetupError,
    catalog,
    codex_argv,
    codex_config,
    codex_env,
    codex_home_for,
    outcome_of_events,
    setup_for,
)
from harnesses.json_events import parse_events
from harnesses.toml_text import TomlValueError, to_toml

FIXTURES = Path(__file__).parent / "fixtures"


def _events(name: str):
    return parse_events((FIXTURES / name).read_text().splitlines())


def test_outcome_of_a_real_run_is_the_leads_last_message():
    outcome = outcome_of_events(_events("codex-exec-spawn.events.jsonl"))
    assert outcome.final_answer == "done 3" and outcome.failure is None
    assert outcome.outputs == {}  # each agent's last answer comes from the ledger (LEDGER_OUTPUT_KINDS)


def test_a_failed_turn_is_the_launchs_failure():
    outcome = outcome_of_events(_events("codex-exec-incomplete.events.jsonl"))
    assert outcome.failure == "Codex reported: Incomplete response returned, reason: max_output_tokens"
    assert outcome.final_answer == "cut off mid"


def test_reconnect_errors_alone_are_no_failure():
    events = parse_events(
        [
            '{"type":"error","message":"Reconnecting... 1/5"}',
            "not json",
            '{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"ok"}}',
            '{"type":"turn.completed","usage":{}}',
        ]
    )
    assert outcome_of_events(events).failure is None and outcome_of_events(events).final_answer == "ok"


def _config(options: CodexOptions, launch: int = 2) -> dict:
    text = to_toml(codex_config("http://127.0.0.1:9/episodes/ref/v1", "/h/cat.json", options, launch=launch))
    return tomllib.loads(text)


def test_the_config_points_codex_at_the_episode_and_asks_no_one():
    config = _config(CodexOptions())
    provider = config["model_providers"]["grove"]
    assert config["model"] == "grove" and config["model_provider"] == "grove"
    assert provider["base_url"] == "http://127.0.0.1:9/episodes/ref/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == TOKEN_ENV
    assert provider["http_headers"] == {"x-grove-launch": "2"}
    assert "stream_idle_timeout_ms" not in provider
    assert config["approval_policy"] == "never" and config["sandbox_mode"] == "workspace-write"
    assert config["web_search"] == "disabled" and config["model_catalog_json"] == "/h/cat.json"
    assert config["agents"] == {"enabled": True, "max_depth": 1}
    assert "model_auto_compact_token_limit" not in config
    for off in (
        "include_environment_context",
        "include_permissions_instructions",
        "include_apps_instructions",
    ):
        assert config[off] is False
    assert config["analytics"] == {"enabled": False} and config["skills"] == {"bundled": {"enabled": False}}
    assert config["features"] == {"goals": False, "view_image": False}
    assert config["tools"] == {"experimental_request_user_input": {"enabled": False}}


def test_options_reach_the_config():
    options = CodexOptions(
        subagents=False,
        max_depth=2,
        auto_compact_token_limit=900,
        sandbox="danger-full-access",
        request_timeout_s=1.5,
    )
    config = _config(options)
    assert (
        config["agents"] == {"enabled": False, "max_depth": 2}
        and config["model_auto_compact_token_limit"] == 900
    )
    assert config["sandbox_mode"] == "danger-full-access"
    assert config["model_providers"]["grove"]["stream_idle_timeout_ms"] == 1500


def test_the_catalog_entry_carries_the_instructions_and_no_reasoning():
    [entry] = catalog("grove", "Answer briefly.", 4096)["models"]
    assert entry["slug"] == "grove" and entry["base_instructions"] == "Answer briefly."
    assert entry["context_window"] == 4096 and entry["supported_reasoning_levels"] == []
    assert entry["supports_search_tool"] is False and entry["input_modalities"] == ["text"]
    assert entry["shell_type"] == "shell_command"
    assert catalog("grove", "x", 4096, shell=False)["models"][0]["shell_type"] == "disabled"


def test_the_delegation_family_and_overrides():
    task = TaskSpec(family="delegation", task_id="t1", params={"words": ["apple", "pear"]})
    setup = setup_for(task, CodexOptions())
    assert setup.message == "Words:\napple\npear" and "spawn_agent" in setup.instructions
    override = setup_for(task, CodexOptions(message="Hi", instructions="Be brief."))
    assert (override.message, override.instructions) == ("Hi", "Be brief.")
    free = setup_for(TaskSpec(family="mine", task_id="t2", params={"message": "Fix it"}), CodexOptions())
    assert free.message == "Fix it"
    with pytest.raises(CodexSetupError, match="no first message for Codex"):
        setup_for(TaskSpec(family="mine", task_id="t3"), CodexOptions())


def test_the_environment_is_built_from_scratch(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    env = codex_env("/e/home", "/e/codex", "tok")
    assert env["CODEX_HOME"] == "/e/codex" and env[TOKEN_ENV] == "tok" and env["HOME"] == "/e/home"
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["TMPDIR"] == "/e/home/tmp"


def test_codex_home_is_outside_temporary_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("GROVE_HOME", "/srv/grove-home")
    under_tmp = codex_home_for(tmp_path / "abc")
    assert under_tmp.parent == Path("/srv/grove-home/codex-homes")
    assert codex_home_for(tmp_path / "abc") == under_tmp != codex_home_for(tmp_path / "abd")
    assert codex_home_for(Path("/srv/runs/harness/abc")) == Path("/srv/runs/harness/abc/codex")


def test_argv_is_one_strict_exec():
    assert codex_argv("/bin/codex", "Words:\napple") == [
        "/bin/codex", "exec", "--strict-config", "--skip-git-repo-check", "--json", "--color", "never",
        "Words:\napple",
    ]  # fmt: skip


def test_the_harness_spec_takes_codex():
    spec = HarnessSpec.model_validate({"kind": "codex", "codex": {"subagents": False}})
    assert spec.codex.version == "0.171.0" and spec.codex.subagents is False
    with pytest.raises(ValueError, match="extra"):
        HarnessSpec.model_validate({"kind": "codex", "codex": {"web_search": True}})


def test_toml_text_round_trips_and_refuses_what_it_cannot_write():
    table = {
        "a": "x\n\"y\"\u00e9\x01", "n": 3, "f": 0.5, "b": True, "l": [1, "two"], "skip": None,
        "t": {"x-grove-launch": "1", "odd key": {"deep": False}}, "empty": {},
    }  # fmt: skip
    parsed = tomllib.loads(to_toml(table))
    assert parsed == {k: v for k, v in table.items() if v is not None}
    with pytest.raises(TomlValueError, match="nan"):
        to_toml({"x": float("nan")})
    with pytest.raises(TomlValueError, match="set"):
        to_toml({"x": {1, 2}})
