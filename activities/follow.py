"""Engines follow their run: before serving a call, load the run's latest committed policy if needed.

Every `generate` call of a run carries a PolicyRef (run id, the oldest version the run allows for it,
the base model). Before the call is admitted to the engine's version gate, the inference worker:

1. finds the run's latest committed checkpoint at or above what it could use: it probes
   `checkpoints/{run}/step-{v+1}/COMMIT` upwards from the version it serves (one HEAD request per call
   in the steady state), or from `min_version` when it serves another run or an older version;
2. loads that version (activities/publish.py: download, verify, in-place reload) unless it serves it.

A call may also cap the version (`max_version`: an evaluation of step N pins exactly N): the engine
then loads at most that version, and refuses the call (`PolicyVersionPassedError`) if it already serves
a newer one of the run; the generate activity checks the version it was admitted under again, since
another call may move the engine on between this load and the call's admission.

So an engine that starts, restarts or joins a run later loads the run's latest committed policy before
its first call of that run, a publication reaches every engine of the run at its next call, and no call
is served by a version older than the run allows (docs/rollout-scale.md says why pulling, not pushing).
The version a call used stays in its receipt, as the version gate reports it.

A run whose allowed version is not committed is an error of the caller (the run workflow only asks
for committed versions): `PolicyNotCommittedError`, non-retryable, naming the run, version and key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from activities.engine import PolicyEngine, PublishReport
from activities.publish import run_publish
from grove.contracts import PolicyRef, PublishInput, PublishResult
from grove.store_layout import commit_key
from storage.base import ObjectStore


class PolicyNotCommittedError(LookupError):
    """A call asks for a policy version of its run that has no committed checkpoint."""


class PolicyVersionPassedError(ValueError):
    """A call pinned to versions <= max_version (an evaluation) reached an engine that already serves a
    newer version of the run: engines only move forward, so this engine cannot serve it."""


def check_served_version(ref: PolicyRef, version: int, what: str) -> None:
    """Raise PolicyVersionPassedError when `version` (what served or would serve `what`) is newer than the
    call allows."""
    if ref.max_version is not None and version > ref.max_version:
        raise PolicyVersionPassedError(
            f"{what} of run {ref.run_id!r} must be served by policy version <= {ref.max_version} (an "
            f"evaluation scores exactly the version it names), but the engine serves version {version} "
            "and never moves back; the call is refused instead of scoring the wrong policy"
        )


@dataclass(frozen=True)
class FollowReport:
    run_id: str
    version: int  # what the engine serves now
    previous_version: int
    loaded: bool  # False: the engine already served it


def latest_committed(store: ObjectStore, run_id: str, at_least: int, at_most: int | None = None) -> int:
    """The newest committed version >= `at_least` (and <= `at_most`, when given) of the run (versions
    commit in order: step N needs N - 1). Version 0 is the base model and always exists."""
    if at_least > 0 and not store.exists(commit_key(run_id, at_least)):
        raise PolicyNotCommittedError(
            f"run {run_id!r}: a call needs policy version >= {at_least}, but "
            f"{commit_key(run_id, at_least)!r} "
            "is not in the store; the run workflow only starts episodes on committed versions: check the "
            "inference worker's store (GROVE_STORE) is the trainer's"
        )
    version = at_least
    while (at_most is None or version < at_most) and store.exists(commit_key(run_id, version + 1)):
        version += 1
    return version


class RunFollower:
    """One per engine: serialises the loads its concurrent calls ask for (one download per version)."""

    def __init__(self, engine: PolicyEngine, store: ObjectStore, weights_root: Path) -> None:
        self.engine = engine
        self.store = store
        self.weights_root = Path(weights_root)
        self._lock = asyncio.Lock()

    def _floor(self, ref: PolicyRef) -> int:
        """Where to probe from: the served version when it is this run's and allowed, else the minimum."""
        if self.engine.run_id == ref.run_id and self.engine.version >= ref.min_version:
            return self.engine.version
        return ref.min_version

    async def follow(self, ref: PolicyRef) -> FollowReport:
        """Make the engine serve the run's latest committed version in [ref.min_version, ref.max_version].
        Raises PolicyVersionPassedError when it already serves a version of the run above max_version."""
        async with self._lock:
            previous = self.engine.version
            if self.engine.run_id == ref.run_id:
                check_served_version(ref, previous, "a call")
            latest = await asyncio.to_thread(
                latest_committed, self.store, ref.run_id, self._floor(ref), ref.max_version
            )
            if self.engine.run_id == ref.run_id and self.engine.version == latest:
                return FollowReport(ref.run_id, latest, previous, loaded=False)
            inp = PublishInput(run_id=ref.run_id, version=latest, base_model=ref.base_model)
            await run_publish(inp, self.engine, self.store, self.weights_root)
            return FollowReport(ref.run_id, self.engine.version, previous, loaded=True)

    async def publish(self, inp: PublishInput) -> tuple[PublishResult, PublishReport]:
        """The run workflow's own publication (publish_weights), under the same lock as the loads
        calls trigger: two loads never download or prune the weights folders at the same time."""
        async with self._lock:
            current = self.engine.version
            if self.engine.run_id == inp.run_id and current > inp.version:
                # a call of the run already made this engine load a newer committed version
                result = PublishResult(version=current, previous_version=current, seconds=0.0)
                return result, PublishReport(current, current, 0.0, 0.0, 0.0, (), already_current=True)
            return await run_publish(inp, self.engine, self.store, self.weights_root)
