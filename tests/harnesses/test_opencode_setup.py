"""The pure part of the OpenCode harness (harnesses/opencode.py): its config, environment and the outcome
read from `opencode run --format json` events.

`fixtures/opencode-run-two-tasks.events.jsonl` is the stdout of a real `opencode run --pure --format json`
(opencode-ai 1.18.33, the restricted `lead` agent) against a scripted OpenAI-compatible server that made
the lead call `task` twice ("Say apple", "Say pear"), answered each worker "reply to <prompt>", then
answered the lead "apple pear".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.contracts import OpenCodeOptions, TaskSpec
from harnesses import delegation
from harnesses.json_events import parse_events
from harnesses.opencode import (
    OpenCodeSetupError,
    opencode_config,
    opencode_env,
    outcome_of_events,
    setup_for,
)

EVENTS = Path(__file__).parent / "fixtures" / "opencode-run-two-tasks.events.jsonl"


@pytest.mark.parametrize("pear_ends_first", [False, True])
def test_outcome_of_a_real_run_with_two_task_calls(pear_ends_first):
    """Subagents are named after their type (`worker`), numbered in the order the lead wrote the calls,
    as the gateway names their contexts, whichever subagent OpenCode reports done first."""
    lines = EVENTS.read_text().splitlines()
    tasks = [i for i, line in enumerate(lines) if '"tool":"task"' in line]
    assert len(tasks) == 2
    if pear_ends_first:
        lines[tasks[0]], lines[tasks[1]] = lines[tasks[1]], lines[tasks[0]]
    outcome = outcome_of_events(parse_events(lines))
    assert outcome.final_answer == "apple pear"
    assert outcome.outputs == {
        "parent": ["apple pear"],
        "worker": ["reply to Say apple"],
        "worker-2": ["reply to Say pear"],
    }
    assert outcome.failure is None


def test_an_error_event_is_the_failure_and_noise_lines_are_skipped():
    lines = [
        "some log line",
        '{"type":"error","sessionID":"ses_a",'
        '"error":{"name":"APIError","data":{"message":"Bad Request: x"}}}',
        "{not json",
    ]
    outcome = outcome_of_events(parse_events(lines))
    assert outcome.failure == "OpenCode reported: Bad Request: x"
    assert outcome.final_answer == "" and outcome.outputs == {}


def test_delegation_setup_and_overrides():
    task = delegation.make_task(3)
    setup = setup_for(task, OpenCodeOptions())
    assert setup.message == "Words:\n" + "\n".join(task.params["words"])
    assert setup.default_agent == "lead"
    assert setup.agents["lead"]["tools"] == {"*": False, "task": True}
    assert setup.agents["general"] == {"disable": True}
    custom = setup_for(task, OpenCodeOptions(message="hi", agents={"solo": {"mode": "primary"}}))
    assert (custom.message, custom.agents, custom.default_agent) == (
        "hi",
        {"solo": {"mode": "primary"}},
        "lead",
    )
    with pytest.raises(OpenCodeSetupError, match="no first message"):
        setup_for(TaskSpec(family="unknown", task_id="u-0"), OpenCodeOptions())
    plain = setup_for(
        TaskSpec(family="unknown", task_id="u-1", params={"message": "do it"}), OpenCodeOptions()
    )
    assert plain.message == "do it" and plain.agents == {}


def test_config_points_the_provider_at_the_episode_and_env_is_built_from_scratch():
    setup = setup_for(delegation.make_task(0), OpenCodeOptions())
    config = opencode_config(
        setup,
        "http://127.0.0.1:1/episodes/abc/v1",
        "grove-tok",
        launch=2,
        context_limit=2048,
        output_limit=64,
    )
    provider = config["provider"]["grove"]
    assert provider["options"] == {
        "baseURL": "http://127.0.0.1:1/episodes/abc/v1",
        "apiKey": "grove-tok",
        "headers": {"x-grove-launch": "2"},
        # OpenCode's own 5-minute waits for a response off: a call queued on a loaded engine is not
        # re-sent while it generates (the launch's deadline bounds the episode)
        "headerTimeout": False,
        "chunkTimeout": False,
    }
    timed = opencode_config(
        setup, "http://h/v1", "t", launch=1, context_limit=2048, output_limit=64, request_timeout_s=2.5
    )["provider"]["grove"]["options"]
    assert (timed["headerTimeout"], timed["chunkTimeout"]) == (2500, 2500)  # OpenCode takes milliseconds
    assert provider["models"]["grove"]["limit"] == {"context": 2048, "output": 64}
    assert config["model"] == config["small_model"] == "grove/grove"  # the gateway's default model id
    assert config["default_agent"] == "lead" and config["share"] == "disabled"
    env = opencode_env("/h")
    assert env["HOME"] == "/h" and env["XDG_DATA_HOME"] == "/h/.local/share"
    assert env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert not any("SECRET" in k or "GROVE" in k for k in env)  # nothing of the worker's environment


def test_an_agent_with_its_own_context_limit_gets_a_model_entry_that_sends_the_served_id():
    """OpenCode compacts a session against its agent's model's `limit.context`: a per-agent limit is a
    second model entry whose API `id` is the gateway's model (measured: OpenCode 1.18.33 then sends
    `"model": <id>`), used by that agent only; the family's agent settings are kept."""
    task = delegation.make_task(0)
    options = OpenCodeOptions(agent_context_limits={"worker": 400})
    setup = setup_for(task, options)
    config = opencode_config(
        setup, "http://h/v1", "t", launch=1, context_limit=4096, output_limit=64,
        agent_context_limits=options.agent_context_limits,
    )  # fmt: skip
    models = config["provider"]["grove"]["models"]
    assert models["grove"]["limit"] == {"context": 4096, "output": 64}
    assert models["grove-worker"] == {
        "id": "grove", "name": "grove-worker", "tool_call": True, "limit": {"context": 400, "output": 64}
    }  # fmt: skip
    assert config["agent"]["worker"] == {**setup.agents["worker"], "model": "grove/grove-worker"}
    assert "model" not in config["agent"]["lead"] and config["model"] == "grove/grove"
    assert "model" not in setup.agents["worker"]  # the family's agents are not modified
    with pytest.raises(ValueError, match="agent_context_limits"):
        OpenCodeOptions(agent_context_limits={"worker": 10})  # below OpenCode's fixed overhead


def test_the_reader_family_gives_its_workers_read_notes_and_a_context_limit_the_run_can_override():
    from harnesses import opencode_reader

    task = opencode_reader.make_task(5)
    assert (
        task == opencode_reader.make_task(5)
        and task.params["words"] != opencode_reader.make_task(6).params["words"]
    )
    setup = setup_for(task, OpenCodeOptions())
    assert setup.agents["worker"]["tools"] == {"*": False, "read": True}
    assert setup.agents["lead"]["tools"] == {"*": False, "task": True}
    assert "notes.txt" in setup.agents["worker"]["prompt"]
    assert (
        list(setup.files) == ["notes.txt"]
        and setup.files["notes.txt"].count("\n") == opencode_reader.NOTES_LINES
    )
    assert setup.agent_context_limits == {"worker": opencode_reader.WORKER_CONTEXT}
    run = setup_for(task, OpenCodeOptions(agent_context_limits={"worker": 900, "lead": 3000}))
    assert run.agent_context_limits == {"worker": 900, "lead": 3000}  # the run's, agent by agent
    config = opencode_config(run, "http://g/v1", "t", launch=1, context_limit=4096, output_limit=128,
                             agent_context_limits=run.agent_context_limits)  # fmt: skip
    assert config["agent"]["worker"]["model"] == "grove/grove-worker"
    assert config["provider"]["grove"]["models"]["grove-worker"]["limit"] == {"context": 900, "output": 128}


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "opencode.json", ""])
def test_a_family_file_outside_the_project_folder_is_refused(path, monkeypatch):
    from harnesses import opencode, opencode_reader

    task = opencode_reader.make_task(0)
    base = opencode.TASK_SETUPS[opencode_reader.FAMILY](task)
    bad = type(base)(message=base.message, agents=base.agents, files={path: "x"})
    monkeypatch.setitem(opencode.TASK_SETUPS, opencode_reader.FAMILY, lambda _task: bad)
    with pytest.raises(OpenCodeSetupError, match=f"project file {path!r}: expected a relative path"):
        setup_for(task, OpenCodeOptions())


async def test_the_runner_writes_the_familys_files_and_the_workers_limit_into_the_launch(
    tmp_path, monkeypatch
):
    """The harness runner's own launch planning for an `opencode-reader` episode: notes.txt in the
    project folder OpenCode runs in, the workers on a model entry with the family's limit (the episode's
    max_tokens as limit.output), the lead on the run's."""
    import json as _json

    from activities.harness import HarnessRunner, RunnerConfig
    from grove.contracts import EpisodeSpec, HarnessSpec
    from grove.sampling import SamplingConfig
    from harnesses import opencode_reader

    stand_in = tmp_path / "opencode"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("GROVE_OPENCODE_BIN", str(stand_in))  # planning only: nothing is run
    task = opencode_reader.make_task(2)
    spec = EpisodeSpec(
        run_id="r", step=1, group_id="r/s000001/t0", episode_id="r/s000001/t0/g0", task=task,
        harness=HarnessSpec(kind="opencode", opencode=OpenCodeOptions(context_limit=4096)),
        sampling=SamplingConfig(max_tokens=128),
    )  # fmt: skip
    runner = HarnessRunner(RunnerConfig("http://127.0.0.1:9", "s" * 32, tmp_path / "root"))
    run = await runner._opencode_launch(spec, 1, "token", "http://127.0.0.1:9/episodes/x/v1")
    assert (run.project / "notes.txt").read_text() == opencode_reader.notes(task)
    config = _json.loads((run.project / "opencode.json").read_text())
    models = config["provider"]["grove"]["models"]
    assert models["grove-worker"]["limit"] == {"context": opencode_reader.WORKER_CONTEXT, "output": 128}
    assert models["grove"]["limit"] == {"context": 4096, "output": 128}
    assert (
        config["agent"]["worker"]["model"] == "grove/grove-worker" and "model" not in config["agent"]["lead"]
    )
    assert config["agent"]["worker"]["tools"] == {"*": False, "read": True}
