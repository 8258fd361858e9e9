"""Run configs as YAML files: examples validate, overrides apply before validation, bad input is named.

Pure tests (no services): grove/runconfig.py and the `grove run schema|validate` commands.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from cli.run_commands import EXIT_INVALID_CONFIG
from grove.contracts import (
    RunConfig,
    RunState,
    UnknownAuxiliaryKindError,
    UntrainableAuxiliaryKindError,
)
from grove.runconfig import (
    ConfigFileError,
    ConfigValidationError,
    OverrideError,
    load_run_config,
    schema_rows,
)

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_and_builds_its_first_step(path: Path):
    from workflows.training_run import step_specs

    cfg = load_run_config(path)
    # the run workflow's own check: its tasks and episodes can be built
    assert len(step_specs(RunState(config=cfg), 1)) == cfg.tasks_per_step * cfg.group_size


def test_the_examples_cover_both_native_delegation_runs():
    agents = {load_run_config(p).train_agents for p in EXAMPLES}
    assert agents == {"all", "parent_only"}
    for field in ("run_id", "inference_queue"):  # side by side: own workflow ids, own engines
        values = [getattr(load_run_config(p), field) for p in EXAMPLES]
        assert len(set(values)) == len(values)


@pytest.mark.parametrize(
    "example", ["opencode-delegation.yaml", "opencode-reader.yaml", "opencode-report.yaml"]
)
def test_the_opencode_examples_are_opencode_runs_their_models_and_engines_can_serve(example):
    """examples/opencode-delegation.yaml (and -reader, -report) through `grove run validate` (the same
    load and engine-limit check `grove run start` does): every episode is launched with OpenCode on a
    family the harness runner can set up, and the context OpenCode is told fits the engine's, which fits
    the model's."""
    from harnesses.opencode import TASK_SETUPS, setup_for
    from models.registry import known_positions
    from workflows.training_run import step_specs

    path = EXAMPLES[0].parent / example
    shown = runner.invoke(app, ["run", "validate", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    cfg = RunConfig.model_validate(json.loads(shown.output))
    assert cfg == load_run_config(path)
    assert cfg.harness.kind == "opencode" and cfg.task_family in TASK_SETUPS
    positions = known_positions(cfg.model)
    assert positions is not None
    assert cfg.harness.opencode.context_limit <= cfg.engine.max_model_len <= positions
    specs = step_specs(RunState(config=cfg), 1)
    assert {s.harness.kind for s in specs} == {"opencode"}
    setup = setup_for(specs[0].task, specs[0].harness.opencode)
    assert setup.default_agent == "lead" and setup.agents["lead"]["tools"] == {"*": False, "task": True}
    assert all(word in setup.message for word in specs[0].task.params["words"])


def test_overrides_are_yaml_values_at_dotted_paths(tmp_path):
    path = write(tmp_path, "run_id: r\nlearner:\n  lr: 1.0e-3\n")
    cfg = load_run_config(
        path,
        ["learner.lr=3e-4", "sampling.temperature=0.8", "learner.betas=[0.8, 0.95]", "steps=7",
         "learner.grad_clip=null", "run_id='007'"],
    )  # fmt: skip
    assert cfg.learner.lr == 0.0003
    assert cfg.sampling.temperature == 0.8
    assert cfg.learner.betas == (0.8, 0.95)
    assert cfg.steps == 7
    assert cfg.learner.grad_clip is None
    assert cfg.run_id == "007"
    assert cfg.learner.clip_low == 0.2  # untouched fields keep their defaults


def test_an_unknown_key_is_refused_with_the_allowed_ones(tmp_path):
    path = write(tmp_path, "run_id: r\nlearner:\n  lrr: 0.1\n")
    with pytest.raises(ConfigValidationError) as err:
        load_run_config(path)
    msg = str(err.value)
    assert "learner.lrr = 0.1: unknown field" in msg
    assert "allowed here: lr, betas" in msg
    with pytest.raises(ConfigValidationError, match=r"stepz = 3: unknown field; allowed here: run_id, model"):
        load_run_config(write(tmp_path, "run_id: r\n"), ["stepz=3"])


def test_a_bad_value_names_the_path_the_value_and_what_is_allowed(tmp_path):
    path = write(tmp_path, "run_id: r\ntrain_agents: workers\n")
    with pytest.raises(ConfigValidationError) as err:
        load_run_config(path, ["learner.lr=-1", "sampling.max_tokens=many"])
    issues = {p: (v, problem) for p, v, problem in err.value.issues}
    assert issues["train_agents"][0] == "workers"
    assert "'all' or 'parent_only'" in issues["train_agents"][1]
    assert issues["learner.lr"][0] == -1 and "greater than 0" in issues["learner.lr"][1]
    assert issues["sampling.max_tokens"][0] == "many" and "valid integer" in issues["sampling.max_tokens"][1]
    assert str(path) in str(err.value) and "learner.lr=-1" in str(err.value)


def test_a_missing_run_id_is_named(tmp_path):
    with pytest.raises(ConfigValidationError, match=r"run_id = \(missing\): required field"):
        load_run_config(write(tmp_path, "steps: 3\n"))


def test_cross_field_rules_are_config_errors_too(tmp_path):
    path = write(tmp_path, "run_id: r\nlearner:\n  lr_schedule: cosine\n")
    with pytest.raises(ConfigValidationError, match="set total_rollouts"):
        load_run_config(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [("run_id: [unclosed\n", "not valid YAML"), ("- a\n- b\n", "must be a mapping")],
)
def test_unreadable_files_are_file_errors(tmp_path, text, match):
    with pytest.raises(ConfigFileError, match=match):
        load_run_config(write(tmp_path, text))
    with pytest.raises(ConfigFileError, match="cannot read it"):
        load_run_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("override", "match"),
    [("learner.lr", "expected dotted.path=value"), ("learner..lr=1", "expected dotted.path=value"),
     ("run_id.x=1", "run_id is 'r', not a mapping")],
)  # fmt: skip
def test_malformed_overrides_are_override_errors(tmp_path, override, match):
    with pytest.raises(OverrideError, match=re.escape(match)):
        load_run_config(write(tmp_path, "run_id: r\n"), [override])


def test_the_documented_json_inputs_still_validate():
    """docs/operations.md's `temporal workflow start --input` examples: extra='forbid' accepts them."""
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    blobs = re.findall(r"--input '(\{.*?\})'", doc, flags=re.S)
    run_inputs = [json.loads(b) for b in blobs if b.startswith('{"config"')]
    assert run_inputs
    for blob in run_inputs:
        RunState.model_validate(blob)


def test_every_config_field_is_documented():
    rows = schema_rows()
    assert {r[0] for r in rows} >= {"run_id", "learner.lr", "sampling.temperature", "harness.program"}
    assert [r[0] for r in rows if not r[3]] == []


runner = CliRunner()


def test_run_schema_prints_every_field_with_default_and_meaning():
    result = runner.invoke(app, ["run", "schema"])
    assert result.exit_code == 0
    assert re.search(r"learner\.lr\s+float\s+\[default: 1e-06\]\n\s+peak learning rate", result.output)
    for path, *_ in schema_rows():
        assert path in result.output
    js = json.loads(runner.invoke(app, ["run", "schema", "--json"]).output)
    assert js["required"] == ["run_id"]
    assert js["additionalProperties"] is False
    assert all("description" in p for p in js["properties"].values())


def test_run_validate_exits_with_the_invalid_config_code(tmp_path):
    path = write(tmp_path, "run_id: r\n")
    ok = runner.invoke(app, ["run", "validate", str(path), "steps=3", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["steps"] == 3
    bad = runner.invoke(app, ["run", "validate", str(path), "steps=0"])
    assert bad.exit_code == EXIT_INVALID_CONFIG
    assert "steps = 0: Input should be greater than or equal to 1" in bad.output
    assert RunConfig.model_fields["steps"].description in bad.output


def test_an_episode_bound_shorter_than_the_launched_harness_may_run_is_refused(tmp_path):
    text = "run_id: r\nharness:\n  kind: opencode\n  deadline_s: 600\n  max_launches: 3\n"
    with pytest.raises(ConfigValidationError, match=r"episode_timeout_s=1800 .* 600 x .* 3 = 1800 s"):
        load_run_config(write(tmp_path, text + "episode_timeout_s: 1800\n"))
    assert load_run_config(write(tmp_path, text + "episode_timeout_s: 1801\n")).episode_timeout_s == 1801
    assert load_run_config(write(tmp_path, text + "episode_timeout_s: null\n")).episode_timeout_s is None
    # a native program runs inside the workflow: no harness deadline to exceed
    assert load_run_config(write(tmp_path, "run_id: r\nepisode_timeout_s: 5\n")).episode_timeout_s == 5


def test_an_unset_episode_bound_fits_a_long_launched_harness_and_survives_the_state_round_trip(tmp_path):
    long = "run_id: r\nharness:\n  kind: python\n  python:\n    entry: m:f\n  deadline_s: 1500\n"
    cfg = load_run_config(write(tmp_path, long))  # 1500 x 3 launches = 4500 s > the 3600 s default
    assert cfg.episode_timeout_s == 1500 * 3 + 600
    assert load_run_config(write(tmp_path, "run_id: r\n")).episode_timeout_s == 3600  # native: the default
    # a run state written before the field existed resumes with the same fitted bound, never refused
    old = RunState(config=cfg).model_dump(mode="json")
    del old["config"]["episode_timeout_s"]
    assert RunState.model_validate(old).config == cfg
    assert RunState.model_validate_json(RunState(config=cfg).model_dump_json()).config == cfg


def test_summaries_are_trained_only_when_the_run_says_so_and_reach_its_episodes(tmp_path):
    from workflows.training_run import step_specs

    assert load_run_config(write(tmp_path, "run_id: r\n")).train_auxiliary == []
    cfg = load_run_config(write(tmp_path, "run_id: r\ntrain_auxiliary: [summary]\n"))
    assert cfg.train_auxiliary == ["summary"]
    assert {tuple(s.train_auxiliary) for s in step_specs(RunState(config=cfg), 1)} == {("summary",)}
    assert load_run_config(
        write(tmp_path, "run_id: r\n"), ["train_auxiliary=[Summary, summary]"]
    ).train_auxiliary == ["summary"]
    assert "train_auxiliary" in runner.invoke(app, ["run", "schema"]).output


@pytest.mark.parametrize(
    ("value", "kind", "match"),
    [
        ("[title]", UntrainableAuxiliaryKindError, "'title' calls are never trained"),
        ("[summary, auxiliary]", UntrainableAuxiliaryKindError, "'auxiliary' calls are never trained"),
        ("true", UntrainableAuxiliaryKindError, "titles and helper calls included"),
        ("[summaries]", UnknownAuxiliaryKindError, "'summaries' is not an auxiliary call kind"),
        ("[action]", UnknownAuxiliaryKindError, "'action' is not an auxiliary call kind"),
        ("3", UnknownAuxiliaryKindError, "3 is not a list of auxiliary call kinds"),
    ],
)
def test_training_titles_or_an_unknown_auxiliary_kind_is_refused_when_the_run_starts(
    tmp_path, value, kind, match
):
    with pytest.raises(ConfigValidationError, match=r"train_auxiliary = .*" + re.escape(match)) as info:
        load_run_config(write(tmp_path, f"run_id: r\ntrain_auxiliary: {value}\n"))
    assert isinstance(info.value.__cause__, kind)
    with pytest.raises(kind):  # the same refusal for a config that never was a file (Python, Temporal)
        RunConfig.model_validate({"run_id": "r", "train_auxiliary": yaml.safe_load(value)})
    bad = runner.invoke(
        app, ["run", "validate", str(write(tmp_path, f"run_id: r\ntrain_auxiliary: {value}\n"))]
    )
    assert bad.exit_code == EXIT_INVALID_CONFIG and match in bad.output
