"""The demo's plot and the step's reward components (pure: no services)."""

from __future__ import annotations

import csv

import pytest

from cli.demo_plots import plot, reward_figure, smooth, write_metrics
from grove.contracts import EpisodeResult, EvalRecord, StepRecord
from workflows.training_run import reward_components


def test_smooth_is_a_trailing_mean_without_look_ahead():
    assert smooth([0.0, 1.0, 2.0, 3.0], window=2) == [0.0, 0.5, 1.5, 2.5]
    assert smooth([4.0, 0.0, 2.0], window=5) == [4.0, 2.0, 2.0]
    assert smooth([], window=3) == []


def episode(eid: str, reward: float, details: dict[str, float], status: str = "ok") -> EpisodeResult:
    return EpisodeResult(
        episode_id=eid, group_id="g", task_id="t", status=status, reward=reward, rows_key="k",
        num_rows=1, eligible_tokens=1, counts={}, reward_details=details,
    )  # fmt: skip


def test_reward_components_average_each_component_over_the_episodes_reporting_it():
    eps = [
        episode("a", 0.5, {"parent": 1.0, "workers": 0.0}),
        episode("b", 0.25, {"parent": 0.0, "workers": 0.5}),
        episode("c", 0.0, {"workers": 0.25}),
    ]
    assert reward_components(eps) == {"parent": 0.5, "workers": 0.25}
    assert reward_components([episode("d", 1.0, {})]) == {}


def history(rewards: list[float], parent: list[float]) -> list[StepRecord]:
    return [
        StepRecord(
            step=i + 1,
            mean_reward=r,
            episodes=4,
            failed_episodes=0,
            policy_version=i + 1,
            reward_components={"parent": p, "workers": 2 * r - p},
        )  # fmt: skip
        for i, (r, p) in enumerate(zip(rewards, parent, strict=True))
    ]


def test_the_figure_shows_raw_points_smoothed_lines_and_per_agent_components(tmp_path):
    histories = {
        "pw": history([0.1, 0.3, 0.2, 0.6, 0.4, 0.8], [0.0, 0.5, 0.5, 1.0, 0.5, 1.0]),
        "po": history([0.1, 0.0, 0.1, 0.0, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
    }
    for r, value in zip(histories["pw"][2::3], (0.25, 0.75), strict=True):  # evaluated at steps 3 and 6
        r.eval = EvalRecord(policy_version=r.step, mean_reward=value, episodes=8, failed_episodes=0)
    fig = reward_figure(histories, "delegation")
    train, parts = fig.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in train.lines}
    eval_line = next(line for line in train.lines if line.get_label() == "pw (eval, held-out)")
    assert (list(eval_line.get_xdata()), list(eval_line.get_ydata())) == ([3, 6], [0.25, 0.75])
    assert "po (eval, held-out)" not in lines
    assert lines["pw (per step)"] == [0.1, 0.3, 0.2, 0.6, 0.4, 0.8]
    # trailing mean of 5, by hand: steps 1..5 average what exists so far, step 6 averages steps 2..6
    assert lines["pw (mean of last 5)"] == pytest.approx([0.1, 0.2, 0.2, 0.3, 0.32, 0.46])
    assert lines["po (mean of last 5)"] == pytest.approx([0.1, 0.05, 0.2 / 3, 0.05, 0.06, 0.04])
    comp = {line.get_label(): list(line.get_ydata()) for line in parts.lines}
    assert set(comp) == {"pw: parent", "pw: workers", "po: parent", "po: workers"}
    assert comp["pw: parent"] == pytest.approx([0.0, 0.25, 1 / 3, 0.5, 0.5, 0.7])

    plot(tmp_path / "reward.png", histories, "delegation")
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_metrics(tmp_path / "metrics.csv", histories)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert rows[3]["run"] == "pw" and float(rows[3]["reward/parent"]) == 1.0
    assert [row["eval_mean_reward"] for row in rows[:6]] == ["", "", "0.250000", "", "", "0.750000"]


def test_without_components_the_figure_has_the_reward_panel_only():
    fig = reward_figure({"x": [StepRecord(step=1, mean_reward=0.5, episodes=1, failed_episodes=0,
                                          policy_version=1)]}, "t")  # fmt: skip
    assert len(fig.axes) == 1
