"""Python harness programs as a run's harness (RunConfig.harness.kind `python`): the config rules, the
process protocol (harnesses/clients/program.py, launched as the runner launches it: the worker's
interpreter, the environment built from scratch, a real subprocess), and the framework delegation
families' config files and reward. No services: the gateway is never reached here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from grove.contracts import HarnessOutcome, RunState, TaskSpec
from grove.runconfig import ConfigValidationError, load_run_config
from harnesses import framework_delegation as fd
from harnesses.clients.program import EXIT_ENTRY_ERROR
from harnesses.json_events import parse_events
from harnesses.programs import family
from harnesses.python_harness import entry_error, outcome_of_events, python_argv, python_env, python_job
from tests.bounds import PROCESS_WAIT

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:9/episodes/cnVuL3MwMDAwMDEvdDAvZzA/v1"
TASK = TaskSpec(family="delegation", task_id="delegation-3", params={"words": ["cat", "moon"]})
FRAMEWORK_EXAMPLES = {
    "langgraph-delegation.yaml": fd.LANGGRAPH,
    "agents-sdk-delegation.yaml": fd.AGENTS_SDK,
}


def launch(tmp_path: Path, entry: str, launch_no: int = 2, options: dict | None = None):
    """The harness process of one launch, exactly as the runner starts it; (exit code, events, stderr)."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    job = python_job(entry, TASK, options or {}, "grove-tiny")
    env = python_env(str(home), job, BASE, "tok-123", launch_no)
    run = subprocess.run(
        python_argv(), cwd=project, env=env, capture_output=True, text=True, timeout=PROCESS_WAIT, check=False
    )
    return run.returncode, parse_events(run.stdout.splitlines()), run.stderr


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------ config


def test_a_python_harness_without_an_entry_is_refused_naming_the_field(tmp_path):
    path = write(tmp_path, "run_id: r\nharness:\n  kind: python\n")
    with pytest.raises(ConfigValidationError, match=r"harness\.python\.entry is not set"):
        load_run_config(path)


@pytest.mark.parametrize("entry", ["harnesses.langgraph_delegation", "a b:run", "mod:", ":run", "x.:y"])
def test_an_entry_not_of_the_form_module_function_is_refused(tmp_path, entry):
    path = write(tmp_path, f"run_id: r\nharness:\n  kind: python\n  python:\n    entry: '{entry}'\n")
    with pytest.raises(ConfigValidationError) as err:
        load_run_config(path)
    assert "harness.python.entry" in str(err.value) and repr(entry) in str(err.value)


@pytest.mark.parametrize("name", sorted(FRAMEWORK_EXAMPLES))
def test_the_framework_examples_load_through_the_config_path_and_name_their_programs(name):
    from workflows.training_run import step_specs

    cfg = load_run_config(ROOT / "examples" / name)
    assert cfg.task_family == FRAMEWORK_EXAMPLES[name] and cfg.harness.kind == "python"
    assert cfg.harness.python.entry == fd.ENTRIES[cfg.task_family]
    module, _, function = cfg.harness.python.entry.partition(":")
    assert importlib.util.find_spec(module) is not None
    make_task, _score = family(cfg.task_family)
    specs = step_specs(RunState(config=cfg), 1)
    assert {s.task.family for s in specs} == {cfg.task_family}
    assert all(len(set(s.task.params["words"])) == 2 and s.harness.kind == "python" for s in specs)
    assert make_task(5).task_id == f"{cfg.task_family}-5"


# ------------------------------------------------------------------------------------------ process


def test_the_program_gets_the_episode_launch_task_and_options_in_an_isolated_process(tmp_path):
    code, events, stderr = launch(tmp_path, "tests.harnesses.python_programs:report", 2, {"colour": "red"})
    assert code == 0, stderr
    assert [e["type"] for e in events] == ["grove.started", "grove.result"]
    outcome = outcome_of_events(events)
    assert outcome.failure is None and outcome.final_answer == "cat moon"
    out = outcome.outputs
    assert out["parent"] == [BASE, "tok-123"]
    assert out["launch"] == ["2", "2"]  # every request of the launch carries x-grove-launch: 2
    assert out["options"] == ["red", "grove-tiny"]
    cwd, home, names = out["where"]
    assert cwd == str(tmp_path / "project") and home == str(tmp_path / "home")
    # nothing of the test's (the worker's) environment leaks in: e.g. no secrets, no VIRTUAL_ENV
    assert "GROVE_GATEWAY_SECRET" not in names and "PYTEST_CURRENT_TEST" not in names


def test_a_sync_function_returning_text_is_the_final_answer(tmp_path):
    code, events, stderr = launch(tmp_path, "tests.harnesses.python_programs:plain")
    assert code == 0, stderr
    assert outcome_of_events(events) == HarnessOutcome(final_answer="plain answer")


@pytest.mark.parametrize(
    "entry, says",
    [
        ("tests.harnesses.no_such_module:run", "cannot import 'tests.harnesses.no_such_module'"),
        ("tests.harnesses.python_programs:no_such_function", "has no function 'no_such_function'"),
    ],
)
def test_an_entry_that_cannot_be_loaded_is_a_configuration_error(tmp_path, entry, says):
    code, events, _ = launch(tmp_path, entry)
    assert code == EXIT_ENTRY_ERROR
    error = entry_error(events)
    assert error is not None and says in error and entry in error


def test_a_failing_program_exits_1_with_its_error_on_stderr_and_no_result(tmp_path):
    code, events, stderr = launch(tmp_path, "tests.harnesses.python_programs:fails")
    assert code == 1 and "RuntimeError: the program gave up: no words" in stderr
    assert entry_error(events) is None
    assert outcome_of_events(events).failure == "the harness program returned no result"


def test_a_program_returning_neither_text_nor_a_mapping_fails_saying_what_to_return(tmp_path):
    code, _, stderr = launch(tmp_path, "tests.harnesses.python_programs:returns_a_number")
    assert code == 1 and "returned a int; return the final answer (str)" in stderr


def test_the_job_is_json_with_the_task_as_the_workflow_has_it():
    job = json.loads(python_job("m:f", TASK, {"k": 1}, "grove"))
    assert TaskSpec.model_validate(job["task"]) == TASK and job["options"] == {"k": 1}


# ------------------------------------------------------------------------------------------ reward


@pytest.mark.parametrize(
    "workers",
    [
        {"worker-1": ["moon"], "worker-2": ["cat"]},  # LangGraph's Send workers, in first-call order
        {"Worker-call_w1": ["cat"], "Worker-call_w2": ["moon"]},  # Agents SDK agent-tool invocations
    ],
)
def test_framework_workers_fill_the_word_slots_and_auxiliary_agents_do_not_count(workers):
    outputs = {"parent": ["Cat, moon."], **workers, "worker-2~aux": ["moon"]}
    result = fd.score(TASK, HarnessOutcome(final_answer="Cat, moon.", outputs=outputs))
    assert result.reward == 1.0 and result.details == {"workers": 1.0, "parent": 1.0}


def test_a_summary_is_no_worker_answer_and_a_missing_worker_scores_zero():
    only_aux = HarnessOutcome(final_answer="cat", outputs={"worker-1": ["cat"], "worker-1~aux": ["moon"]})
    result = fd.score(TASK, only_aux)
    assert result.details == {"workers": 0.5, "parent": 0.5} and result.reward == 0.5
