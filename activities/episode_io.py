"""Episode activities on the `io` queue: reward, row materialization, staging cleanup.

Thin shells: load from the object store, call the pure core (the task family's scorer,
trainer.forest.reconstruct), store. Every write is idempotent (deterministic key, put_if_absent),
so a retried activity finds its own bytes and verifies them.
"""

from __future__ import annotations

import numpy as np
from temporalio import activity

from grove.contracts import (
    CleanStagingInput,
    CleanStagingResult,
    MaterializeInput,
    MaterializeResult,
    RewardInput,
    RewardResult,
)
from harnesses.programs import family
from storage.base import ObjectStore
from trainer.forest import MEMBER_STATES, EpisodeRef, ReconstructionOptions, reconstruct
from trainer.rows import Row, rows_to_parquet
from trainer.staging_format import CallTokens, decode_call_tokens, staging_prefix


def placeholder_row(inp: MaterializeInput) -> Row:
    """A failed episode's single row: no loss, valid=False, so its group stays complete."""
    return Row(
        row_id=f"{inp.episode_id}#placeholder",
        episode_id=inp.episode_id,
        group_id=inp.group_id,
        input_ids=np.zeros(1, dtype=np.int32),
        loss_mask=np.zeros(1, dtype=np.bool_),
        behavior_logprobs=np.zeros(1, dtype=np.float32),
        spans=(),
        reward=inp.reward,
        valid=False,
    )


class EpisodeIO:
    """Activities that need only the object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name="score_episode")
    def score_episode(self, inp: RewardInput) -> RewardResult:
        _, scorer = family(inp.task.family)
        return scorer(inp.task, inp.outcome)

    def _tokens(self, inp: MaterializeInput) -> dict[str, CallTokens]:
        return {
            r.call_id: decode_call_tokens(self.store.get(r.staging_key), key=r.staging_key)
            for r in inp.receipts
            if r.state in MEMBER_STATES and r.staging_key is not None
        }

    @activity.defn(name="materialize_episode")
    def materialize_episode(self, inp: MaterializeInput) -> MaterializeResult:
        if inp.valid:
            rec = reconstruct(
                EpisodeRef(episode_id=inp.episode_id, group_id=inp.group_id),
                inp.receipts,
                self._tokens(inp),
                ReconstructionOptions(train_agents=inp.train_agents, train_auxiliary=inp.train_auxiliary),
                reward=inp.reward,
            )
            rows, eligible = rec.rows, rec.accounting.eligible_tokens
        else:
            rows, eligible = [placeholder_row(inp)], 0
        self.store.put_if_absent(inp.rows_key, rows_to_parquet(rows))
        return MaterializeResult(
            rows_key=inp.rows_key, num_rows=len(rows), eligible_tokens=eligible, placeholder=not inp.valid
        )

    @activity.defn(name="clean_staging")
    def clean_staging(self, inp: CleanStagingInput) -> CleanStagingResult:
        if inp.keep:
            return CleanStagingResult(deleted=0)
        keys = self.store.list(staging_prefix(inp.episode_id))
        for key in keys:
            self.store.delete(key)
        return CleanStagingResult(deleted=len(keys))
