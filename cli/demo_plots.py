"""The demo's outputs beside its runs: `metrics.csv` (every step's record of both runs, one row each) and
`reward.png` (each run's mean reward per step with its trailing mean, held-out evaluations, and the reward's
components), rewritten after every recorded step (cli/demo.py `follow`)."""

from __future__ import annotations

import csv
from pathlib import Path

from grove.contracts import StepRecord


def write_metrics(path: Path, histories: dict[str, list[StepRecord]]) -> None:
    keys = sorted({k for h in histories.values() for r in h for k in r.metrics})
    parts = sorted({k for h in histories.values() for r in h for k in r.reward_components})
    rollout = sorted({k for h in histories.values() for r in h for k in r.rollout})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "mean_reward", "episodes", "failed_episodes", "policy_version", *keys,
                    *(f"reward/{k}" for k in parts), *(f"rollout/{k}" for k in rollout),
                    "eval_mean_reward"])  # fmt: skip
        for run_id, history in histories.items():
            for r in history:
                w.writerow([run_id, r.step, f"{r.mean_reward:.6f}", r.episodes, r.failed_episodes,
                            r.policy_version, *(r.metrics.get(k, "") for k in keys),
                            *(r.reward_components.get(k, "") for k in parts),
                            *(r.rollout.get(k, "") for k in rollout),
                            f"{r.eval.mean_reward:.6f}" if r.eval else ""])  # fmt: skip


SMOOTH_WINDOW = 5


def smooth(values: list[float], window: int = SMOOTH_WINDOW) -> list[float]:
    """Trailing mean of the last `window` values: step N's point uses steps <= N only (no look-ahead,
    so the curve never shows a gain before it happened)."""
    return [
        sum(values[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
        for i in range(len(values))
    ]


def reward_figure(histories: dict[str, list[StepRecord]], title: str):
    """Left: each run's mean reward per step (raw points) and its trailing mean. Right (when the task's
    reward reports components, e.g. delegation's parent and workers): each component, smoothed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = sorted({k for h in histories.values() for r in h for k in r.reward_components})
    fig, axes = plt.subplots(1, 2 if parts else 1, figsize=(13 if parts else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    for i, (run_id, history) in enumerate(histories.items()):
        steps, raw = [r.step for r in history], [r.mean_reward for r in history]
        ax.plot(steps, raw, ".", color=f"C{i}", alpha=0.35, label=f"{run_id} (per step)")
        ax.plot(steps, smooth(raw), "-", color=f"C{i}", label=f"{run_id} (mean of last {SMOOTH_WINDOW})")
        evals = [(r.step, r.eval.mean_reward) for r in history if r.eval is not None]
        if evals:
            ax.plot(
                *zip(*evals, strict=True),
                "s--",
                color=f"C{i}",
                markersize=4,
                label=f"{run_id} (eval, held-out)",
            )
    _decorate(ax, title, "mean reward (train; squares: held-out eval)")
    if parts:
        ax = axes[0][1]
        styles = ["-", "--", ":", "-."]
        for i, (run_id, history) in enumerate(histories.items()):
            for j, part in enumerate(parts):
                points = [(r.step, r.reward_components[part]) for r in history if part in r.reward_components]
                if points:
                    xs, values = zip(*points, strict=True)
                    ax.plot(xs, smooth(list(values)), styles[j % len(styles)], color=f"C{i}",
                            label=f"{run_id}: {part}")  # fmt: skip
        _decorate(ax, f"reward components (mean of last {SMOOTH_WINDOW})", "component reward")
    fig.tight_layout()
    return fig


def _decorate(ax, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot(path: Path, histories: dict[str, list[StepRecord]], title: str) -> None:
    import matplotlib.pyplot as plt

    fig = reward_figure(histories, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
