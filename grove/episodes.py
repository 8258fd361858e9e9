"""Episode records: the learner's list of the logical rollouts of one step, rows or no rows.

Rows only describe episodes that produced rows. An episode that closed fine with no trainable call
(only an auxiliary call, or no model call at all) reconstructs to zero rows, and a child workflow
that was terminated never published any; both are still logical rollouts of their group. So the
train step gets one `EpisodeRecord` per episode the run started (the run workflow knows them all
from its step's specs, however each child ended), and the advantage code computes every group
baseline over these records, then fans the advantages out to the rows (trainer/advantages.py).

Status and failure kind (the failure rule, docs/design.md section 7):
- `ok`: the episode's reward counts in its group's baseline; its rows train with its advantage.
- `failed`, kind `policy`: the policy's own behaviour failed the attempt (a malformed tool call or
  other native-harness error, an external harness's reported failure, a prompt that grew too long, a
  generation the engine refused for the policy's request). It counts in the baseline with the run's
  `LearnerConfig.failure_reward` (its own recorded reward is ignored); its rows (a placeholder)
  carry no loss, so it acts on the group only through the baseline.
- `failed`, kind `infrastructure`: the system lost the attempt (lost attempts exhausted, the child
  workflow failed, was terminated or timed out, the store was down). Excluded from the baseline,
  advantage 0, no loss; the step's metrics and StepRecord count it.

Pure pydantic (no numpy, no I/O): grove/contracts/ carries these records through Temporal.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EpisodeStatus = Literal["ok", "failed"]
FailureKind = Literal["policy", "infrastructure"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("policy", "infrastructure")


class EpisodeRecord(BaseModel):
    """One logical rollout of a step: what the learner needs besides its rows.

    `EpisodeRecord(episode_id="e", group_id="g", reward=1.0)` is an ok episode; a failed one names
    its kind: `EpisodeRecord(..., status="failed", failure_kind="policy")`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    episode_id: str
    group_id: str
    reward: float = 0.0  # the episode's own reward (rows carry the same value); failed: informational
    status: EpisodeStatus = "ok"
    failure_kind: FailureKind | None = None  # required when failed, None when ok
    failure: str | None = None  # the reason, for logs and the UI
    rows_key: str | None = None  # where its rows were published; None: nothing to load (terminated child)
    num_rows: int | None = Field(None, ge=0)  # rows it published, when known: checked against the batch

    @model_validator(mode="after")
    def _kind_matches_status(self) -> EpisodeRecord:
        if self.status == "failed" and self.failure_kind is None:
            raise ValueError(
                f"episode {self.episode_id!r} is failed but names no failure_kind; say 'policy' (counts "
                "in the baseline with failure_reward) or 'infrastructure' (excluded from the baseline)"
            )
        if self.status == "ok" and self.failure_kind is not None:
            raise ValueError(
                f"episode {self.episode_id!r} is ok but has failure_kind={self.failure_kind!r}; "
                "only a failed episode has a failure kind"
            )
        return self

    @property
    def in_baseline(self) -> bool:
        """Counts in its group's baseline: ok, or failed by the policy's own behaviour."""
        return self.status == "ok" or self.failure_kind == "policy"

    @property
    def trained(self) -> bool:
        """Its rows carry loss (only ok episodes do)."""
        return self.status == "ok"
