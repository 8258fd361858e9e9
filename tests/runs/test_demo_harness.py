"""`grove demo --harness opencode`: the two runs and the worker it starts, checked the
way the real commands check them (pure: nothing is started). The OpenCode demo's checks read tiny-copy's
tokenizer and positions, which are tiny-tools' (tests/fixtures/models.py `tools_twin_dir`): its weights,
many minutes of training, play no part.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.demo import (
    DemoConfig,
    model_name,
    orchestration_worker_args,
    prepare_model,
    run_configs,
    summary_lines,
)
from cli.main import app
from cli.runs import check_run_engine
from grove import queues
from grove.contracts import RunState, StepRecord
from grove.runconfig import load_run_config
from harnesses.opencode import TASK_SETUPS, setup_for
from models.registry import ensure_model, known_positions, uncached_builds
from workflows.training_run import step_specs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_opencode_demo_trains_opencode_episodes_beside_the_parent_only_baseline(tools_twin_dir):
    cfg = DemoConfig(harness="opencode", steps=3)
    assert model_name(cfg) == "tiny-copy"
    model_dir = tools_twin_dir  # tiny-copy's tokenizer and positions
    assert known_positions(model_dir) == known_positions("tiny-copy")
    pw, po = run_configs(cfg, model_dir)
    assert (pw.train_agents, po.train_agents) == ("all", "parent_only")
    assert pw.model_dump(exclude={"run_id", "train_agents", "inference_queue"}) == po.model_dump(
        exclude={"run_id", "train_agents", "inference_queue"}
    )
    assert pw.inference_queue != po.inference_queue  # one engine per policy
    for run in (pw, po):
        check_run_engine(run)  # what `grove run start` refuses: a context past the model's positions
        assert run.harness.kind == "opencode" and run.task_family in TASK_SETUPS
        assert run.harness.opencode.context_limit <= run.engine.max_model_len <= known_positions(model_dir)
        assert lead_reply_tokens(model_dir) <= run.sampling.max_tokens  # OpenCode's limit.output
        specs = step_specs(RunState(config=run), 1)
        assert {s.harness.kind for s in specs} == {"opencode"}
        setup = setup_for(specs[0].task, specs[0].harness.opencode)
        assert setup.agents["lead"]["tools"] == {"*": False, "task": True}
    args = orchestration_worker_args([pw, po], model_dir)
    served = args[args.index("--queues") + 1].split(",")
    assert queues.HARNESS in served and queues.INFERENCE not in served  # inference: one worker per run
    # the harness worker's embedded gateway measures prompts with the engines' context
    assert args[args.index("--max-model-len") + 1] == str(pw.engine.max_model_len)


def lead_reply_tokens(model_dir: Path) -> int:
    """The longest reply of 100 held-out tasks' leads: two `task` calls, each word written twice."""
    from transformers import AutoTokenizer

    from models.copy_tune import CopyDrillWriter, encode

    tok, writer = AutoTokenizer.from_pretrained(str(model_dir)), CopyDrillWriter(0, held_out=True)
    return max(int(sum(encode(tok, *writer.lead_first()).weights)) for _ in range(100))


def test_the_native_demo_is_unchanged():
    cfg = DemoConfig()
    assert model_name(cfg) == "tiny"
    runs = run_configs(cfg, ensure_model("tiny"))
    assert {r.harness.kind for r in runs} == {"native"} and {r.task_family for r in runs} == {"delegation"}
    assert {r.sampling.max_tokens for r in runs} == {8}
    args = orchestration_worker_args(runs, ensure_model("tiny"))
    assert args[args.index("--queues") + 1] == "episodes,io,trainer" and "--max-model-len" not in args
    assert {r.learner.kl_coef for r in runs} == {0.0}
    anchored = run_configs(DemoConfig(kl_coef=0.04), ensure_model("tiny"))  # `grove demo --kl-coef 0.04`
    assert {r.learner.kl_coef for r in anchored} == {0.04}  # both runs: the pair differs only in agents


def test_an_unknown_demo_harness_is_refused_before_anything_starts():
    result = CliRunner().invoke(app, ["demo", "--harness", "langchain"])
    assert result.exit_code == 2
    assert "--harness 'langchain': expected one of native, opencode, langgraph, agents-sdk" in result.output


@pytest.mark.parametrize(
    "harness, family", [("langgraph", "langgraph-delegation"), ("agents-sdk", "agents-sdk-delegation")]
)
def test_the_framework_demos_launch_their_programs_beside_the_parent_only_baseline(harness, family):
    """The same pair as the examples/<family>.yaml runs: a Python program per episode on the harness
    queue, one run training every agent, the other only the parent."""
    from grove.runconfig import load_run_config

    cfg = DemoConfig(harness=harness, steps=3)
    model_dir = ensure_model(model_name(cfg))
    pw, po = run_configs(cfg, model_dir)
    assert (pw.train_agents, po.train_agents) == ("all", "parent_only")
    assert pw.model_dump(exclude={"run_id", "train_agents", "inference_queue"}) == po.model_dump(
        exclude={"run_id", "train_agents", "inference_queue"}
    )
    example = load_run_config(EXAMPLES / f"{family}.yaml")
    for run in (pw, po):
        check_run_engine(run)
        assert run.task_family == family and run.harness.kind == "python"
        assert run.harness.python.entry == example.harness.python.entry
        assert run.sampling == example.sampling  # the example's sampling: 8 tokens, temperature 0.7
        assert {s.harness.kind for s in step_specs(RunState(config=run), 1)} == {"python"}
    args = orchestration_worker_args([pw, po], model_dir)
    assert queues.HARNESS in args[args.index("--queues") + 1].split(",")


def test_the_opencode_reader_demo_runs_the_reader_family_on_tiny_reader():
    cfg = DemoConfig(harness="opencode", family="opencode-reader", steps=3)
    assert model_name(cfg) == "tiny-reader"
    runs = run_configs(cfg, Path("/models/tiny-reader"))
    assert {r.task_family for r in runs} == {"opencode-reader"}
    assert {r.harness.kind for r in runs} == {"opencode"}


def test_the_opencode_report_demo_runs_the_report_family_on_tiny_report():
    """`grove demo --harness opencode --family opencode-report`: the reader's episodes (a worker context
    limit, notes.txt) under the report family's reward, on the model drilled in several report shapes."""
    cfg = DemoConfig(harness="opencode", family="opencode-report", steps=3)
    assert model_name(cfg) == "tiny-report"
    pw, po = run_configs(cfg, Path("/models/tiny-report"))
    assert (pw.train_agents, po.train_agents) == ("all", "parent_only")
    for run in (pw, po):
        assert run.task_family == "opencode-report" and run.harness.kind == "opencode"
        specs = step_specs(RunState(config=run), 1)
        setup = setup_for(specs[0].task, specs[0].harness.opencode)
        assert setup.agent_context_limits == {"worker": 1200} and "notes.txt" in setup.files


def test_a_demo_family_is_refused_for_other_harnesses_and_unknown_names():
    for args in (["--family", "opencode-reader"], ["--harness", "opencode", "--family", "opencode-x"]):
        result = CliRunner().invoke(app, ["demo", *args])
        assert result.exit_code == 2
        families = "opencode-delegation, opencode-reader, opencode-report"
        assert f"only with --harness opencode, one of {families}" in result.output


def test_the_chain_of_builds_a_model_needs_on_a_fresh_machine(tmp_path):
    """What the demo announces before it builds: every fine-tune needs its base first (nothing built)."""
    assert uncached_builds("tiny-report", cache_dir=tmp_path) == [
        "tiny-tools", "tiny-copy", "tiny-resume", "tiny-reader", "tiny-report",
    ]  # fmt: skip
    assert uncached_builds("tiny-copy", cache_dir=tmp_path) == ["tiny-tools", "tiny-copy"]
    assert uncached_builds(str(tmp_path), cache_dir=tmp_path) == []  # a folder is never built
    assert not any(tmp_path.iterdir())


def test_the_demo_announces_each_model_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GROVE_MODELS", str(tmp_path / "models"))
    model_dir = prepare_model("tiny-random")  # a real build, into an empty cache
    said = capsys.readouterr().out
    assert "model 'tiny-random' is not in the model cache: building tiny-random first" in said
    assert "[demo] building model 'tiny-random' ..." in said and "[demo] built 'tiny-random' in " in said
    assert model_dir.parent == tmp_path / "models"
    assert prepare_model("tiny-random") == model_dir  # cached now: nothing to announce
    assert "building" not in capsys.readouterr().out


def test_a_demo_seed_gives_both_runs_the_same_other_tasks():
    """`grove demo --seed N`: the pair trains on other tasks than seed 0's, both runs on the same ones."""
    model_dir = ensure_model("tiny")

    def tasks(seed: int) -> list[list[list[str]]]:
        return [
            [[s.task.task_id for s in step_specs(RunState(config=run), step)] for step in range(1, 6)]
            for run in run_configs(DemoConfig(seed=seed, steps=5), model_dir)
        ]

    default, seeded = tasks(0), tasks(7)
    assert default[0] == default[1] and seeded[0] == seeded[1]
    assert seeded[0] != default[0]
    result = CliRunner().invoke(app, ["demo", "--seed", "-1"])  # refused before anything starts
    assert result.exit_code == 2 and "--seed" in result.output


def test_demo_overrides_set_both_runs_and_leave_the_pair_its_own():
    cfg = DemoConfig(overrides=["learner.adv_std_scaling=false", "sampling.top_p=0.9"])
    pw, po = run_configs(cfg, Path("/models/tiny"))
    assert (pw.learner.adv_std_scaling, po.learner.adv_std_scaling) == (False, False)
    assert (pw.sampling.top_p, po.sampling.top_p) == (0.9, 0.9)
    assert (pw.train_agents, po.train_agents) == ("all", "parent_only")  # still the pair
    assert pw.learner.lr == po.learner.lr == 5e-4  # what the flags set is kept


@pytest.mark.parametrize(
    "override, says",
    [
        ("train_agents=all", "train_agents is set by the demo for each run of the pair"),
        (
            "learner.adv_std_scaling=maybe",
            "learner.adv_std_scaling = 'maybe': Input should be a valid boolean",
        ),
        ("learner.bogus=1", "learner.bogus = 1: unknown field"),
        ("steps", "expected dotted.path=value"),
    ],
)
def test_a_bad_demo_override_is_refused_before_anything_starts(override, says, tmp_path):
    result = CliRunner().invoke(app, ["demo", "--set", override, "--out-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not any(tmp_path.iterdir())  # no run folder: refused before the model, the server, the workers


def _steps(rewards: list[float]) -> list[StepRecord]:
    return [
        StepRecord(step=i + 1, mean_reward=r, episodes=4, failed_episodes=0, policy_version=i + 1)
        for i, r in enumerate(rewards)
    ]


def test_the_demo_summary_compares_halves_and_the_pair_step_by_step():
    histories = {
        "d-parent-and-workers": _steps([0.2, 0.4, 0.5, 0.9]),
        "d-parent-only": _steps([0.3, 0.3, 0.6]),  # stopped a step early: compared on steps 1-3
    }
    lines = summary_lines(histories)
    assert "d-parent-and-workers" in lines[1] and "0.300 -> 0.700  (4 steps, 2 per half)" in lines[1]
    assert "d-parent-only" in lines[2] and "0.300 -> 0.600  (3 steps, 1 per half)" in lines[2]
    # steps 1-3: -0.1, +0.1, -0.1
    assert lines[3].endswith("per step: -0.033 (ahead at 1 of 3 steps)")


def test_the_summaries_demo_pairs_summaries_trained_with_not_trained_and_nothing_else():
    # on tiny-summary: tiny's summaries keep no word, so they all score alike (docs/results.md 1.7)
    assert model_name(DemoConfig(summaries=True)) == "tiny-summary"
    assert model_name(DemoConfig(summaries=True, model="tiny")) == "tiny"
    runs = run_configs(DemoConfig(summaries=True, name="s"), ensure_model("tiny"))
    trained, untrained = runs
    assert (trained.run_id, untrained.run_id) == ("s-summaries-trained", "s-summaries-not-trained")
    assert (trained.train_auxiliary, untrained.train_auxiliary) == (["summary"], [])
    assert {r.train_agents for r in runs} == {"all"}
    assert {r.task_family for r in runs} == {"summary-delegation"}
    mine = {"run_id", "train_auxiliary", "inference_queue"}
    assert trained.model_dump(exclude=mine) == untrained.model_dump(exclude=mine)
    # the examples are the same pair
    for run, name in ((trained, "trained"), (untrained, "not-trained")):
        example = load_run_config(EXAMPLES / f"summary-delegation-{name}.yaml")
        assert example.train_auxiliary == run.train_auxiliary and example.task_family == run.task_family
        assert example.model == "tiny-summary"
    refused = CliRunner().invoke(app, ["demo", "--summaries", "--harness", "opencode"])
    assert refused.exit_code == 2 and "--summaries: only with --harness native" in refused.output


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_the_coding_harness_demos_launch_their_stock_harness_on_the_tool_policy(harness):
    """`grove demo --harness claude-code|codex`: the family's stock harness per episode, on the tool policy
    (smol-agent, known by its spec: nothing is built here), in engines that hold its positions, and the
    orchestration worker serving the harness queue that launches them."""
    from harnesses.claude_code import TASK_SETUPS as CLAUDE_SETUPS
    from harnesses.codex import TASK_SETUPS as CODEX_SETUPS

    cfg = DemoConfig(harness=harness, steps=2)
    assert model_name(cfg) == "smol-agent"
    positions = known_positions("smol-agent")
    base = ensure_model("smollm2")  # smol-agent's base: the same tokenizer and positions
    run_configs(cfg, Path(model_name(cfg)))  # the CLI's check before the model is built: by name alone
    pw, po = run_configs(cfg, base)
    assert (pw.train_agents, po.train_agents) == ("all", "parent_only")
    setups = CLAUDE_SETUPS if harness == "claude-code" else CODEX_SETUPS
    for run in (pw, po):
        check_run_engine(run)
        assert run.harness.kind == harness and run.task_family in setups
        assert run.engine.max_model_len <= positions
        assert {s.harness.kind for s in step_specs(RunState(config=run), 1)} == {harness}
    args = orchestration_worker_args([pw, po], base)
    assert queues.HARNESS in args[args.index("--queues") + 1].split(",")
