"""The activities an episode workflow schedules, each with the options it runs under (Temporal workflow code).

- IO activities (reward, materialize, ledger pages and indexes, a completion by reference, clean staging)
  run on the IO queue and retry with capped exponential backoff for as long as a storage outage lasts
  (`IO_PATIENCE`); only typed bad input fails them at once. Each attempt heartbeats its phase, so the UI
  shows the attempt and the last failure.
- `generate` runs once per call id on the run's inference queue: a retry after a lost attempt is a new
  admission under a new call id (workflows/episode.py), so nothing is trained twice. A large completion
  comes back by reference (`COMPLETION_INLINE_MAX`) to a caller that reads references.
- `run_harness` launches the external harness process on the harness queue; a lost runner (worker killed:
  heartbeat timeout) is relaunched up to `HarnessSpec.max_launches` times, a spec the runner can never
  launch is not retried.

Only what schedules an activity lives here; what the workflow makes of a result or a failure is in
workflows/episode.py, workflows/episode_outcome.py and workflows/episode_failures.py. Imported passed
through by workflows/episode.py (the workflow sandbox does not re-import it).
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar, overload

from temporalio import workflow
from temporalio.common import RetryPolicy

from grove import queues
from grove.contracts import (
    COMPLETION_INLINE_MAX,
    CallRequest,
    GenerateInput,
    GenerateResult,
    HarnessRunInput,
    HarnessRunResult,
)
from ledger.handover import EpisodeRun

T = TypeVar("T")

GENERATE_TIMEOUT = timedelta(minutes=5)
GENERATE_HEARTBEAT = timedelta(seconds=20)
IO_TIMEOUT = timedelta(minutes=2)  # one attempt
IO_PATIENCE = timedelta(minutes=30)  # all attempts: a storage outage (preemption, restart) may last this long
IO_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # unlimited within IO_PATIENCE; typed bad input is raised non-retryable
)

# The harness runner's refusals of a spec it can never launch: retrying (relaunching) cannot help.
RUNNER_CONFIG_ERRORS = ("HarnessConfigError", "OpenCodeSetupError", "OpenCodeInstallError")


@overload
async def io_activity(activity: str, arg: object, result_type: type[T], *more: object) -> T: ...


@overload
async def io_activity(activity: str, arg: object, result_type: None, *more: object) -> None: ...


async def io_activity(activity: str, arg: object, result_type: type[T] | None, *more: object) -> T | None:
    """Run one IO activity with the IO queue's patience (module docstring)."""
    return await workflow.execute_activity(
        activity, args=[arg, *more], task_queue=queues.IO, start_to_close_timeout=IO_TIMEOUT,
        schedule_to_close_timeout=IO_PATIENCE, retry_policy=IO_RETRY, result_type=result_type,
    )  # fmt: skip


async def generate(spec: EpisodeRun, call_id: str, req: CallRequest) -> GenerateResult:
    """One generation attempt of an admitted call."""
    inp = GenerateInput(
        episode_id=spec.episode_id,
        call_id=call_id,
        prompt=req.prompt,
        sampling=req.sampling or spec.sampling,
        policy=spec.policy,
    )
    # Patched in: a large completion comes back by reference (COMPLETION_INLINE_MAX); runs recorded
    # before it asked for inline completions and replay as they ran. Only for a caller that reads
    # references (`completion_by_ref`: the gateway, the native entry of the workflow): a gateway of
    # before the claim check, which cannot decode one, gets its completion inline (a rolling deploy).
    # patched() first: a recorded run's marker is met whatever the request says.
    if workflow.patched("grove-completion-by-ref") and req.completion_by_ref:
        inp.completion_inline_max = COMPLETION_INLINE_MAX
    # One attempt per call id: a retry after a crash is a new admission (module docstring).
    return await workflow.execute_activity(
        "generate", inp, task_queue=spec.inference_queue, start_to_close_timeout=GENERATE_TIMEOUT,
        heartbeat_timeout=GENERATE_HEARTBEAT, retry_policy=RetryPolicy(maximum_attempts=1),
        result_type=GenerateResult,
    )  # fmt: skip


def run_harness(spec: EpisodeRun) -> Awaitable[HarnessRunResult]:
    """The harness runner's activity (activities/harness.py); the caller schedules it."""
    harness = spec.harness
    return workflow.execute_activity(
        "run_harness", HarnessRunInput(spec=spec), task_queue=queues.HARNESS,
        start_to_close_timeout=timedelta(seconds=harness.deadline_s + 300),
        heartbeat_timeout=timedelta(seconds=harness.heartbeat_timeout_s),
        retry_policy=RetryPolicy(
            maximum_attempts=harness.max_launches, initial_interval=timedelta(seconds=1),
            non_retryable_error_types=list(RUNNER_CONFIG_ERRORS),
        ),
        result_type=HarnessRunResult,
    )  # fmt: skip
