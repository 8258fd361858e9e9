"""The inference worker: one process, one PolicyEngine, serving `generate` and `publish_weights`.

Activities are methods of `InferenceActivities`, which holds the engine and the object store
(Temporal's pattern for activities that share a resource). Typed failures that a retry cannot fix
(bad prompt spec, undeclared discontinuity, stale version, ...) become non-retryable
ApplicationErrors whose `type` is the exception class name; any other failure (an aborted request,
a rolled-back publication) propagates as a retryable error of its own type.

Run a worker: `python -m activities.inference_worker --model tiny` (Temporal address from
GROVE_TEMPORAL_ADDRESS, store from storage.config).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities import engine_errors as errors
from activities.engine import PolicyEngine
from activities.engine_config import EngineConfig
from activities.follow import PolicyNotCommittedError, PolicyVersionPassedError, RunFollower
from activities.generate import StagedCallConflictError, run_generate
from capture.prompt import ParentNotStagedError, PromptSpecError
from chat.render import ChatRenderError
from grove import queues
from grove.contracts import GenerateInput, GenerateResult, PublishInput, PublishResult
from grove.staging_format import StagedObjectError
from storage.base import DigestMismatchError, ObjectStore
from trainer.checkpoint import CheckpointError

# Failures that the same input would hit again.
NON_RETRYABLE: tuple[type[Exception], ...] = (
    PromptSpecError,
    ParentNotStagedError,
    StagedCallConflictError,
    StagedObjectError,
    DigestMismatchError,
    ChatRenderError,
    CheckpointError,
    PolicyNotCommittedError,
    PolicyVersionPassedError,
    errors.EmptyPromptError,
    errors.PromptTooLongError,
    errors.TokenIdOutOfRangeError,
    errors.StaleVersionError,
    errors.VersionConflictError,
    errors.WeightsMismatchError,
    errors.EngineBrokenError,
    errors.NonFiniteLogprobError,  # the served weights give NaN/inf: the same call would again
)
# errors.EngineDiedError stays retryable: the episode treats it as a lost attempt and re-runs the call on
# a live worker, while cli/worker.py takes this worker (and its dead engine) down.


GRACEFUL_SHUTDOWN = timedelta(seconds=5)


class DataConverterError(ValueError):
    """The Temporal client does not use the pydantic data converter every grove process must use."""


def _non_retryable(exc: Exception, what: str) -> ApplicationError:
    return ApplicationError(f"{what}: {exc}", type=type(exc).__name__, non_retryable=True)


class InferenceActivities:
    """The activities of the `inference` task queue, bound to one engine and one store."""

    def __init__(self, engine: PolicyEngine, store: ObjectStore, weights_root: Path | None = None) -> None:
        self.engine = engine
        self.store = store
        self.weights_root = Path(weights_root or tempfile.mkdtemp(prefix="grove-weights-"))
        self.follower = RunFollower(engine, store, self.weights_root)

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        try:
            if inp.policy is not None:  # serve the run's latest committed policy (activities/follow.py)
                await self.follower.follow(inp.policy)
            return await run_generate(inp, self.engine, self.store)
        except NON_RETRYABLE as exc:
            raise _non_retryable(exc, f"generate call {inp.call_id} of episode {inp.episode_id}") from exc

    @activity.defn(name="publish_weights")
    async def publish_weights(self, inp: PublishInput) -> PublishResult:
        try:
            result, report = await self.follower.publish(inp)
        except NON_RETRYABLE as exc:
            raise _non_retryable(exc, f"publish_weights {inp.run_id} version {inp.version}") from exc
        activity.logger.info(
            "published %s v%d (from v%d) in %.3f s: drain %.3f s, reload %.3f s, repacked %s",
            inp.run_id, report.version, report.previous_version, report.seconds, report.drain_seconds,
            report.reload_seconds, list(report.repacked),
        )  # fmt: skip
        return result


def build_inference_worker(
    client: Client,
    engine: PolicyEngine,
    store: ObjectStore,
    *,
    weights_root: Path | None = None,
    max_concurrent_activities: int = 64,
    task_queue: str = queues.INFERENCE,
) -> Worker:
    """A Temporal worker for the inference queue; concurrent generate activities share the engine,
    whose scheduler batches them (so allow as many concurrent activities as the engine has seqs)."""
    converter = client.data_converter.payload_converter_class
    if not issubclass(converter, PydanticPayloadConverter):
        raise DataConverterError(
            f"the Temporal client uses {converter.__name__}; connect with grove.client.connect() (pydantic "
            "data converter) so GenerateInput/GenerateResult cross the boundary as pydantic models"
        )
    acts = InferenceActivities(engine, store, weights_root)
    return Worker(
        client,
        task_queue=task_queue,
        activities=[acts.generate, acts.publish_weights],
        max_concurrent_activities=max_concurrent_activities,
        # On shutdown (SIGTERM, or this worker's engine died) calls in flight get a moment to finish or
        # report their own error (EngineDiedError: a lost attempt the episode re-runs) before they
        # are cancelled.
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )


async def _main(args: argparse.Namespace) -> None:
    from grove.client import connect
    from models.registry import ensure_model
    from storage.config import store_from_env

    engine = await PolicyEngine.start(EngineConfig(model_dir=ensure_model(args.model)))
    try:
        worker = build_inference_worker(await connect(), engine, store_from_env())
        await worker.run()
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="grove inference worker (vLLM engine on the inference queue)"
    )
    parser.add_argument(
        "--model", default="tiny", help="model name (tiny, tiny-random, smollm2) or HF folder"
    )
    asyncio.run(_main(parser.parse_args()))
