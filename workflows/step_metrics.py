"""A step's numbers for people: rollout statistics of its episodes and the flat scalars tracked per step.

Pure (the run workflow imports it in its sandbox; activities/tracking.py writes what `step_scalars`
returns). Tags are grouped the way TensorBoard shows them: reward/, eval/, episodes/, rollout/,
learner/, time/.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from grove.contracts import EpisodeResult, StepRecord
from grove.receipts import CallKind, CallReceipt, CallState, ContextOrigin, ContextRecord, ToolCallOutcome

TOOLS_OFFERED = "tools_offered"  # calls whose request offered tools (each has a ToolCallOutcome)
REWRITES = "rewrite_contexts"  # declared rewrites (compactions): each opened a REWRITE context
SUMMARIES = "summary_calls"  # calls of kind SUMMARY (a compaction's summary of its agent's context)


def call_stats(calls: Iterable[CallReceipt], contexts: Iterable[ContextRecord]) -> dict[str, int]:
    """An episode's tool-call outcomes and compactions, counted from its ledger (EpisodeResult.call_stats).

    Keys: `tools_offered`, `tool_calls_<outcome>` per ToolCallOutcome, `rewrite_contexts`,
    `summary_calls` (summary calls the harness used: completed, or settled auxiliary)."""
    calls = list(calls)
    outcomes = [c.tool_call for c in calls if c.tool_call is not None]
    stats = {TOOLS_OFFERED: len(outcomes)}
    stats |= {f"tool_calls_{o.value}": sum(1 for x in outcomes if x == o) for o in ToolCallOutcome}
    stats[REWRITES] = sum(1 for c in contexts if c.origin == ContextOrigin.REWRITE)
    used = (CallState.COMPLETED, CallState.AUXILIARY)
    stats[SUMMARIES] = sum(1 for c in calls if c.kind == CallKind.SUMMARY and c.state in used)
    return stats


def tool_call_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Over every episode of the step that reported its calls (ok or failed: a malformed call is often
    what failed it): the fraction of tool-offering calls per outcome, and compactions per episode."""
    counted = [r for r in results if r.call_stats]
    if not counted:
        return {}
    out = {"compactions_per_episode": sum(r.call_stats.get(REWRITES, 0) for r in counted) / len(counted)}
    offered = sum(r.call_stats.get(TOOLS_OFFERED, 0) for r in counted)
    if offered:
        for o in ToolCallOutcome:
            key = f"tool_calls_{o.value}"
            out[f"{key}_fraction"] = sum(r.call_stats.get(key, 0) for r in counted) / offered
    return out


def summary_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Over the step's episodes that reported their calls: summary calls made (compactions' summaries)
    and, of them, the calls and completion tokens trained (0 unless the run trains summaries)."""
    counted = [r for r in results if r.call_stats]
    if not counted:
        return {}
    return {
        "summary_calls": float(sum(r.call_stats.get(SUMMARIES, 0) for r in counted)),
        "summary_calls_trained": float(sum(r.summary_calls_trained for r in counted)),
        "summary_tokens_trained": float(sum(r.summary_tokens_trained for r in counted)),
    }


def rollout_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Reward spread and episode size over the step's ok episodes (calls, rows, trained tokens), summary
    calls made and trained (`summary_metrics`), and tool-call validity and compactions over all its
    episodes (`tool_call_metrics`)."""
    ok = [r for r in results if r.status == "ok"]
    out = tool_call_metrics(results) | summary_metrics(results)
    if not ok:
        return out
    rewards = [r.reward for r in ok]
    mean = sum(rewards) / len(rewards)
    return out | {
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
        out["eval/policy_version"] = float(record.eval.policy_version)
        out["eval/failed_episodes"] = float(record.eval.failed_episodes)
        out |= {f"eval/{k}": v for k, v in record.eval.reward_components.items()}
    return {k: float(v) for k, v in sorted(out.items()) if math.isfinite(v)}
