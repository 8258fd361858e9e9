"""A step's numbers for people: rollout statistics of its episodes and the flat scalars tracked per step.

Pure (the run workflow imports it in its sandbox; activities/tracking.py writes what `step_scalars`
returns). Tags are grouped the way TensorBoard shows them: reward/, eval/, episodes/, rollout/,
learner/, time/.
"""

from __future__ import annotations

import math

from grove.contracts import EpisodeResult, StepRecord


def rollout_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Reward spread and episode size over the step's ok episodes (calls, rows, trained tokens)."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return {}
    rewards = [r.reward for r in ok]
    mean = sum(rewards) / len(rewards)
    return {
        "reward_std": math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)),
        "calls_per_episode": sum(sum(r.counts.values()) for r in ok) / len(ok),
        "rows_per_episode": sum(r.num_rows for r in ok) / len(ok),
        "eligible_tokens_per_episode": sum(r.eligible_tokens for r in ok) / len(ok),
    }


def step_scalars(record: StepRecord) -> dict[str, float]:
    """Every number of a step record under its TensorBoard tag."""
    out = {
        "reward/mean": record.mean_reward,
        "episodes/total": float(record.episodes),
        "episodes/failed": float(record.failed_episodes),
        "policy_version": float(record.policy_version),
    }
    if "reward_std" in record.rollout:
        out["reward/std"] = record.rollout["reward_std"]
    out |= {f"reward/{k}": v for k, v in record.reward_components.items()}
    out |= {f"rollout/{k}": v for k, v in record.rollout.items() if k != "reward_std"}
    out |= {f"learner/{k}": v for k, v in record.metrics.items()}
    out |= {f"time/{k}": v for k, v in record.timings.items()}
    if record.eval is not None:
        out["eval/mean_reward"] = record.eval.mean_reward
        out["eval/failed_episodes"] = float(record.eval.failed_episodes)
        out |= {f"eval/{k}": v for k, v in record.eval.reward_components.items()}
    return {k: float(v) for k, v in sorted(out.items()) if math.isfinite(v)}
