"""Worker processes: one process can serve any set of grove's task queues.

    grove worker --queues episodes,io,trainer,inference --model tiny     # everything on one machine

At scale each queue is its own pool: `episodes` and `io` are cheap CPU workers, `inference` hosts a
vLLM engine per process, `trainer` owns the GPU(s) of the learner. Any number of inference workers may
serve a run's inference queue: each loads the run's latest committed policy before it serves a call
(activities/follow.py, docs/rollout-scale.md).

Readiness: a worker polls its queues only once it can serve them, so Temporal's list of a queue's pollers says
which queues are served (grove/queue_readiness.py: what the gateway's `/readyz` and `grove infra status`
read). A worker with the inference queue loads its engine first (slow on CPU, more so on a loaded machine:
docs/results.md section 5; vLLM's start blocks this process's event loop) and polls every queue after; a
request that reaches the gateway meanwhile waits for it (gateway/temporal/worker_wait.py) and a generation
scheduled meanwhile waits in the inference queue; SIGTERM meanwhile stops the worker and its engine
processes at once (`grove worker`: cli/sigterm_while_loading.py). The engine's CPU binding goes to its log
(activities/cpu_binding.py). `say` gets one line when the engine starts loading and one when every queue is
polled ("worker ready: ...").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from grove import queues
from grove.contracts import EngineLimits
from grove.gates import GatedStore, Gates

log = logging.getLogger("grove.worker")

# A dead worker's sticky queue would otherwise hold the next workflow task for 10 s (infra_probe.md).
STICKY_TIMEOUT = timedelta(seconds=2)


class UnknownQueueError(ValueError):
    """A queue name that is not one of grove's task queues."""


def parse_queues(spec: str | Sequence[str]) -> list[str]:
    names = [q.strip() for q in (spec.split(",") if isinstance(spec, str) else spec) if q.strip()]
    bad = [q for q in names if q not in queues.ALL]
    if bad or not names:
        raise UnknownQueueError(f"unknown task queues {bad or names}; choose from {list(queues.ALL)}")
    return names


def engine_limits(**flags: int | None) -> EngineLimits:
    """The engine limits of `grove worker`'s flags; a flag left out (None) keeps EngineLimits' default.
    Out-of-range values raise pydantic's ValidationError naming the field."""
    return EngineLimits(**{k: v for k, v in flags.items() if v is not None})


def episodes_worker(client: Client) -> Worker:
    from workflows.episode import EpisodeWorkflow
    from workflows.training_run import TrainingRunWorkflow

    return Worker(
        client,
        task_queue=queues.EPISODES,
        workflows=[EpisodeWorkflow, TrainingRunWorkflow],
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
    )


def _gated(store):
    """Tests only: `store` holding at armed write points (grove/gates.py); `store` itself otherwise."""
    gates = Gates.from_env()
    return store if gates is None else GatedStore(store, gates)


def io_worker(client: Client, store) -> Worker:
    from activities.engine_status import EngineStatusActivities
    from activities.episode_io import EpisodeIO
    from activities.tracking import track_step

    io = EpisodeIO(_gated(store))
    engines = EngineStatusActivities(store)
    return Worker(
        client,
        task_queue=queues.IO,
        activities=[
            io.score_episode,
            io.materialize_episode,
            io.clean_staging,
            io.store_ledger_page,
            io.store_ledger_index,
            io.archive_step_records,
            io.load_ledger_page,
            io.load_completion,
            track_step,
            engines.engine_statuses,
        ],
        activity_executor=ThreadPoolExecutor(max_workers=4),
    )


def trainer_worker(client: Client, store, work_dir: Path, device: str | None) -> Worker:
    from activities.training import TrainerActivities

    acts = TrainerActivities(_gated(store), work_dir / "trainer", device=device)
    # one step at a time: the learner is a single in-memory model
    return Worker(
        client,
        task_queue=queues.TRAINER,
        activities=[acts.train_step, acts.stage_base_model],
        max_concurrent_activities=1,
    )


async def run_worker(
    client: Client,
    queue_names: Sequence[str],
    *,
    store,
    model: str = "tiny",
    work_dir: Path | None = None,
    device: str | None = None,
    engine_config: dict | None = None,
    engine=None,
    inference_queue: str = queues.INFERENCE,
    harness=None,
    wedge_sweep_s: float | None = None,
    say: Callable[[str], None] = lambda line: None,
    sigterm_stops_loading: bool = False,
) -> None:
    """Serve `queue_names` until cancelled; the inference queue starts a vLLM engine first
    (or uses `engine`, a started PolicyEngine the caller owns and shuts down); the harness queue runs
    harness processes (activities/harness.py; `harness`: its HarnessWorkerOptions, default an embedded
    gateway). With the episodes queue and `wedge_sweep_s`, it also ends wedged episodes every that many
    seconds (activities/wedged_episodes.py; `grove worker` sweeps every 60 s). `sigterm_stops_loading`:
    SIGTERM while the engine loads exits the process (cli/sigterm_while_loading.py; `grove worker`'s,
    which owns its process)."""
    work_dir = Path(work_dir or tempfile.mkdtemp(prefix="grove-worker-"))
    workers: list[Worker] = []
    owned_engine = None
    names = parse_queues(queue_names)
    if queues.EPISODES in names:
        workers.append(episodes_worker(client))
    if queues.IO in names:
        workers.append(io_worker(client, store))
    if queues.TRAINER in names:
        workers.append(trainer_worker(client, store, work_dir, device))
    if queues.INFERENCE in names:
        from activities.engine import PolicyEngine
        from activities.engine_config import EngineConfig
        from activities.inference_worker import build_inference_worker
        from cli.sigterm_while_loading import stop_on_sigterm
        from models.registry import ensure_model

        if engine is None:
            config = EngineConfig(model_dir=ensure_model(model), **(engine_config or {}))
            say(f"worker: loading the inference engine ({model}) for queue {inference_queue!r} ...")
            started = time.monotonic()
            gates = Gates.from_env()
            if gates is not None:  # tests: a worker whose engine has not started yet
                await gates.hold("engine_start", inference_queue)
            loading = stop_on_sigterm(say) if sigterm_stops_loading else contextlib.nullcontext()
            with loading:
                engine = owned_engine = await PolicyEngine.start(config)
            say(f"worker: engine loaded in {time.monotonic() - started:.0f} s")
            if engine.cpu_binding is not None:
                say(f"worker: {engine.cpu_binding.describe()}")
        workers.append(
            build_inference_worker(
                client, engine, store, weights_root=work_dir / "weights", task_queue=inference_queue
            )
        )
    background: list[asyncio.Task] = []
    if queues.EPISODES in names and wedge_sweep_s:
        from activities.wedged_episodes import sweep_forever

        background.append(asyncio.create_task(sweep_forever(client, every_s=wedge_sweep_s)))
    if queues.INFERENCE in names:  # the engine's state for progress queries (activities/engine_status.py)
        from activities.engine_status import report_forever

        background.append(asyncio.create_task(report_forever(engine, store, inference_queue)))
    try:
        async with contextlib.AsyncExitStack() as stack:
            if queues.HARNESS in names:
                from activities.harness import HarnessWorkerOptions, build_harness_worker, harness_runner

                options = harness or HarnessWorkerOptions(policy_model=model)
                runner = await stack.enter_async_context(harness_runner(client, store, options, work_dir))
                workers.append(build_harness_worker(client, runner))
            await _serve(workers, engine, lambda: say(f"worker ready: polling {names}"))
    finally:
        for task in background:
            task.cancel()
        if owned_engine is not None:
            await owned_engine.shutdown()


async def _serve(workers: list[Worker], engine, on_polling: Callable[[], None] = lambda: None) -> None:
    """Run the workers until one fails or is cancelled, or until the engine dies: then raise its
    EngineDiedError, so the process exits instead of answering every inference call with an error
    (Temporal retries those calls on a live worker). `on_polling`: called once every worker polls."""
    tasks = [asyncio.create_task(w.run()) for w in workers]
    watch = asyncio.create_task(engine.wait_died()) if engine is not None else None
    polling = asyncio.create_task(_until_polling(workers, on_polling))
    try:
        done, _ = await asyncio.wait([*tasks, *([watch] if watch else [])], return_when=FIRST_COMPLETED)
        if watch is not None and watch in done:
            raise watch.result()
        for task in done:
            task.result()  # a worker that stopped by itself: surface its error
    finally:
        for task in [*tasks, *([watch] if watch else []), polling]:
            task.cancel()
        # let the Temporal workers shut down (report what their activities raised) before we return
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until_polling(workers: list[Worker], then: Callable[[], None]) -> None:
    """Call `then` once Temporal lists this process among the live pollers of each worker's queue
    (grove/queue_readiness.py): ready means polled, not merely started."""
    from grove.queue_readiness import QueueKind, queue_state

    try:
        for w in workers:
            config = w.config()
            identity = config.get("identity") or w.client.identity
            kind: QueueKind = "workflow" if config.get("workflows") else "activity"
            while identity not in (await queue_state(w.client, w.task_queue, kind)).workers:
                await asyncio.sleep(0.2)  # a worker's first poll reaches the server within moments
    except RPCError as err:  # Temporal did not answer: the workers say so themselves
        log.warning("worker: could not confirm the queues are polled: %s", err)
        return
    then()
