"""Test kit: drive a real Ledger with hand-written token arrays, then reconstruct (pure code, no fakes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grove.receipts import CallKind, CallReceipt, ContextOrigin, ContextRecord
from grove.sampling import SamplingProcessing
from grove.staging_format import CallTokens
from grove.store_layout import staging_key
from ledger.accounting import LedgerAccounting
from ledger.ledger import Ledger
from trainer.forest import EpisodeRef, Reconstruction, ReconstructionOptions, reconstruct

# What the test calls were "sampled" with (the generate activity reports it; the kit stands in for it).
SAMPLED = SamplingProcessing(temperature=1.0, top_p=1.0)


def tokens(prompt: list[int], completion: list[int], logprobs: list[float]) -> CallTokens:
    return CallTokens.of(prompt, completion, logprobs)


@dataclass
class Episode:
    """A ledger plus the staged arrays of its completed calls, driven step by step like a workflow."""

    episode_id: str = "ep"
    group_id: str = "grp"
    ledger: Ledger = field(init=False)
    staged: dict[str, CallTokens] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ledger = Ledger(episode_id=self.episode_id, group_id=self.group_id)

    def root(self, context_id: str, agent: str) -> None:
        self.ledger.open_context(ContextRecord(context_id=context_id, agent=agent, origin=ContextOrigin.ROOT))

    def spawn(self, context_id: str, agent: str, by: str) -> None:
        self.ledger.open_context(
            ContextRecord(context_id=context_id, agent=agent, origin=ContextOrigin.SPAWN, spawned_by_call=by)
        )

    def rewrite(self, context_id: str, agent: str, of: str) -> None:
        self.ledger.open_context(
            ContextRecord(context_id=context_id, agent=agent, origin=ContextOrigin.REWRITE, rewrite_of=of)
        )

    def admit(
        self,
        call_id: str,
        context_id: str,
        extends: str | None = None,
        *,
        branch: bool = False,
        kind: CallKind = CallKind.ACTION,
    ) -> CallReceipt:
        return self.ledger.admit(call_id, context_id, kind=kind, extends=extends, branch=branch)

    def complete(
        self, call_id: str, arrays: CallTokens, version: int = 1, sampling: SamplingProcessing = SAMPLED
    ) -> CallReceipt:
        self.staged[call_id] = arrays
        return self.ledger.complete(
            call_id, staging_key(self.episode_id, call_id), arrays.digests(), version, finish_reason="stop",
            sampling=sampling,
        )  # fmt: skip

    def call(
        self, call_id: str, context_id: str, arrays: CallTokens, extends: str | None = None, **kw
    ) -> None:
        """Admit and complete in one go (no overlap with other calls of the context)."""
        version = kw.pop("version", 1)
        sampling = kw.pop("sampling", SAMPLED)
        self.admit(call_id, context_id, extends, **kw)
        self.complete(call_id, arrays, version, sampling)

    def close(self, cancel_outstanding: bool = False) -> LedgerAccounting:
        return self.ledger.close(cancel_outstanding=cancel_outstanding)

    def reconstruct(
        self, options: ReconstructionOptions | None = None, reward: float = 0.0
    ) -> Reconstruction:
        return reconstruct(
            EpisodeRef(episode_id=self.episode_id, group_id=self.group_id),
            self.ledger.receipts(),
            self.staged,
            options,
            reward=reward,
        )


def assert_row(
    row, *, row_id: str, input_ids: list[int], mask: list[int], logprobs: list[float], spans
) -> None:
    """Compare one row against hand-written expectations (spans: (call_id, start, end, owned, eligible))."""
    assert row.row_id == row_id
    assert row.input_ids.dtype == np.int32 and row.input_ids.tolist() == input_ids
    assert row.loss_mask.dtype == np.bool_ and row.loss_mask.astype(int).tolist() == mask
    assert row.behavior_logprobs.dtype == np.float32
    np.testing.assert_array_equal(row.behavior_logprobs, np.asarray(logprobs, dtype=np.float32))
    assert [(s.call_id, s.start, s.end, s.owned, s.eligible) for s in row.spans] == spans
