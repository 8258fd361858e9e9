"""Operating training runs through Temporal: start or resume, status, list, cancel, episodes of a step.

Thin shells over the Temporal client and TrainingRunWorkflow's queries and results; `grove run ...`
(cli/run_commands.py) prints what these return. A run is the workflow whose id is its `run_id`:

- start: no such workflow -> a new run. Running with the same config -> attach (a resumed client,
  a worker restart: the workflow carried on by itself). Completed -> if it stopped early (cancelled) or
  the config now asks for more steps, a new execution under the same id continues from the recorded
  history at the next step (nothing is redone: each recorded step's episodes and checkpoint exist);
  otherwise there is nothing to do. A config that differs from the recorded one in anything but
  `steps` is refused (RunConflictError), as is a run that failed or was terminated/cancelled by Temporal.
- cancel: the workflow's `cancel` signal: the step in progress finishes, no new one starts.
- status / episodes / list: describe, the `progress` query or the result, and visibility queries on
  the search attributes the workflows set (GroveRun, GroveStep, GroveStatus).

Errors are typed so the command maps each to its exit code: RunNotFoundError, ServerUnreachableError,
RunConflictError (and grove.runconfig.RunConfigError before anything is contacted).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from grove import queues
from grove.client import connect, temporal_address
from grove.contracts import EpisodeResult, RunConfig, RunResult, RunState, StepRecord
from grove.store_layout import step_record_key
from grove.visibility import of_run, run_clause
from storage.base import ObjectStore

QUERY_TIMEOUT = timedelta(seconds=10)
DEFAULT_UI = "http://127.0.0.1:8233"
MUTABLE_FIELDS = {"steps"}  # what may change when a run is resumed under the same id


class RunOpsError(Exception):
    """Base of the errors `grove run` maps to exit codes."""


class RunNotFoundError(RunOpsError, LookupError):
    """No run (or no episodes of the asked step) with this id on the server."""


class ServerUnreachableError(RunOpsError, ConnectionError):
    """The Temporal frontend did not answer."""


class RunConflictError(RunOpsError):
    """The run id exists in a state the request cannot use (other config, failed, terminated)."""


class RunFailedError(RunOpsError):
    """The run workflow failed (the message carries the cause)."""


# ------------------------------------------------------------------------------------------ plumbing


async def open_client(address: str | None = None) -> Client:
    addr = address or temporal_address()
    try:
        return await connect(addr)
    except Exception as err:  # the SDK raises RuntimeError (or a core error) for a dead frontend
        raise ServerUnreachableError(
            f"Temporal server at {addr} is unreachable ({err}); start it with `grove infra up` "
            "or point --address / GROVE_TEMPORAL_ADDRESS at a running one"
        ) from err


def ui_url(run_id: str, client: Client | None = None) -> str:
    """The run's page in the Temporal UI: under GROVE_TEMPORAL_UI if set, else under the UI of the server
    `grove infra up` (or `grove demo`) recorded at the client's address, else under the default UI."""
    base = (os.environ.get("GROVE_TEMPORAL_UI") or _recorded_ui(client) or DEFAULT_UI).rstrip("/")
    return f"{base}/namespaces/default/workflows/{quote(run_id, safe='')}"


def _recorded_ui(client: Client | None) -> str | None:
    from infra.stack import load_state

    if client is None:
        return None
    rec = load_state().services.get("temporal")
    if rec is None or rec.address != client.service_client.config.target_host:
        return None  # another server: its UI port is not known here
    return rec.ui_url


async def _describe(handle: WorkflowHandle):
    try:
        return await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(
                f"run {handle.id!r} not found on the server; `grove run list` shows the runs"
            ) from None
        raise _unreachable_or(err) from err


def _unreachable_or(err: RPCError) -> Exception:
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return ServerUnreachableError(f"Temporal server stopped answering: {err.message}")
    return err


async def _list(client: Client, query: str) -> list[WorkflowExecution]:
    """Latest execution per workflow id (continue-as-new leaves one closed execution per chain link)."""
    latest: dict[str, WorkflowExecution] = {}
    try:
        async for wf in client.list_workflows(query):
            have = latest.get(wf.id)
            if have is None or wf.start_time > have.start_time:
                latest[wf.id] = wf
    except RPCError as err:
        raise _unreachable_or(err) from err
    return [latest[k] for k in sorted(latest)]


def _attr(wf: WorkflowExecution, name: str) -> Any:
    for pair in wf.typed_search_attributes:
        if pair.key.name == name:
            return pair.value
    return None


async def _recorded_config(desc: Any) -> RunConfig | None:
    try:
        raw = await desc.memo_value("config", None)
    except Exception:  # memo written by something else
        return None
    return RunConfig.model_validate(raw) if raw else None


def _differences(old: RunConfig, new: RunConfig) -> list[str]:
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    return sorted(k for k in a if a[k] != b.get(k))


def _check_same(old: RunConfig | None, new: RunConfig, allowed: set[str]) -> None:
    if old is None:
        return
    diff = [k for k in _differences(old, new) if k not in allowed]
    if diff:
        raise RunConflictError(
            f"run {new.run_id!r} exists with a different config: {', '.join(diff)} differ "
            f"({', '.join(f'{k}={getattr(old, k)!r} -> {getattr(new, k)!r}' for k in diff)}); "
            "a run keeps its config (only steps may change on resume): revert them or use a new run_id"
        )


# ------------------------------------------------------------------------------------------ start


@dataclass
class StartOutcome:
    run_id: str
    action: str  # started | attached | resumed | already-completed
    next_step: int
    steps: int
    ui: str
    handle: WorkflowHandle | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "handle"}


async def _start(client: Client, state: RunState, reuse: WorkflowIDReusePolicy) -> WorkflowHandle:
    from workflows.training_run import TrainingRunWorkflow

    cfg = state.config
    return await client.start_workflow(
        TrainingRunWorkflow.run,
        state,
        id=cfg.run_id,
        task_queue=queues.EPISODES,
        id_reuse_policy=reuse,
        # a concurrent `start` of the same id attaches instead of failing
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # the config as set (defaults filled in again when read): the whole dump passed Temporal's 2 KB memo
        # warning, which its core prints on stdout, into a `--json` answer
        memo={
            "config": cfg.model_dump(mode="json", exclude_defaults=True),
            "model": cfg.model,
            "train_agents": cfg.train_agents,
        },
    )  # the result type (RunResult) comes from the run method's annotation


def check_run_engine(cfg: RunConfig) -> None:
    """Refuse a run whose engine context is longer than its model's positions (when known without
    building the model), or whose KV cache cannot hold one such context (when the model is a folder on
    this machine: its config says the bytes per token); the engine checks both again when it starts."""
    from pathlib import Path

    from activities.engine_config import EngineConfig, check_engine_limits
    from models.limits import check_positions
    from models.registry import known_positions

    where = f"run {cfg.run_id!r} (model {cfg.model!r})"
    check_positions(cfg.engine.max_model_len, known_positions(cfg.model), where)
    if (Path(cfg.model) / "config.json").is_file():
        # the step budget is the worker's to check: a GPU engine prefills in chunks
        check_engine_limits(EngineConfig.from_limits(Path(cfg.model), cfg.engine), chunked_prefill=True)


async def start_run(client: Client, cfg: RunConfig) -> StartOutcome:
    check_run_engine(cfg)
    handle = client.get_workflow_handle(cfg.run_id, result_type=RunResult)
    try:
        desc = await _describe(handle)
    except RunNotFoundError:
        handle = await _start(client, RunState(config=cfg), WorkflowIDReusePolicy.REJECT_DUPLICATE)
        return StartOutcome(cfg.run_id, "started", 1, cfg.steps, ui_url(cfg.run_id, client), handle)
    old = await _recorded_config(desc)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        _check_same(old, cfg, set())
        step = _attr(desc, "GroveStep") or 1
        return StartOutcome(cfg.run_id, "attached", step, cfg.steps, ui_url(cfg.run_id, client), handle)
    if desc.status != WorkflowExecutionStatus.COMPLETED:
        raise RunConflictError(
            f"run {cfg.run_id!r} is {desc.status.name} (not resumable under the same id); see why in "
            f"{ui_url(cfg.run_id, client)} and start under a new run_id"
        )
    _check_same(old, cfg, MUTABLE_FIELDS)
    done: RunResult = await handle.result()
    if done.steps >= cfg.steps:
        return StartOutcome(
            cfg.run_id, "already-completed", done.steps + 1, cfg.steps, ui_url(cfg.run_id, client)
        )
    # the result carries the last steps' records; the earlier ones stay in the store (RunState.history_from)
    state = RunState(
        config=cfg, next_step=done.steps + 1, history=done.history, history_from=done.history_from
    )
    handle = await _start(client, state, WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    return StartOutcome(cfg.run_id, "resumed", state.next_step, cfg.steps, ui_url(cfg.run_id, client), handle)


def step_history(
    store: ObjectStore, run_id: str, history: list[StepRecord], history_from: int
) -> list[StepRecord]:
    """Every step's record of a run: those its state no longer carries (steps before `history_from`,
    in the store at step_record_key), then the carried ones."""
    archived = [
        StepRecord.model_validate_json(store.get(step_record_key(run_id, step)))
        for step in range(1, history_from)
    ]
    return archived + list(history)


async def wait_run(handle: WorkflowHandle) -> RunResult:
    """The run's result; a failed run raises RunFailedError with Temporal's failure message."""
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        raise RunFailedError(f"run {handle.id!r} failed: {_cause(err)}") from err


def _cause(err: BaseException) -> str:
    while (cause := getattr(err, "cause", None)) is not None:
        err = cause
    return str(err)


# ------------------------------------------------------------------------------------------ status


async def run_progress(client: Client, run_id: str) -> tuple[Any, RunState | None, RunResult | None]:
    """(description, live state or None, result or None): the result of a completed run, else the
    `progress` query (None when no worker answers it in time)."""
    handle = client.get_workflow_handle(run_id, result_type=RunResult)
    desc = await _describe(handle)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return desc, None, await handle.result()
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return desc, None, None
    try:
        state = await handle.query("progress", result_type=RunState, rpc_timeout=QUERY_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.FAILED_PRECONDITION):
            return desc, None, None  # no worker polls the episodes queue right now
        raise _unreachable_or(err) from err
    return desc, state, None


async def run_status(client: Client, run_id: str) -> dict[str, Any]:
    desc, state, result = await run_progress(client, run_id)
    config = state.config if state else await _recorded_config(desc)
    history: list[StepRecord] = result.history if result else state.history if state else []
    steps_done = result.steps if result else state.steps_recorded if state else 0
    current = _attr(desc, "GroveStep")
    steps_to_check = sorted({s for s in (history[-1].step if history else None, current) if s})
    failed = []
    for step in steps_to_check:
        failed += [e for e in await step_episodes(client, run_id, step, missing_ok=True) if e["failed"]]
    return {
        "run_id": run_id,
        "workflow_status": desc.status.name if desc.status else "UNKNOWN",
        "run_status": _attr(desc, "GroveStatus"),
        "cancelled": bool(result and result.cancelled),
        "step": current,
        "steps_done": steps_done,
        "steps": config.steps if config else None,
        "last": history[-1].model_dump(mode="json") if history else None,
        "failed_episodes": failed,
        "progress_available": state is not None or result is not None,
        "live": state.live.model_dump(mode="json") if state is not None and state.live else None,
        "ui": ui_url(run_id, client),
    }


# ------------------------------------------------------------------------------------------ list


async def list_runs(client: Client) -> list[dict[str, Any]]:
    runs = await _list(client, "WorkflowType = 'TrainingRunWorkflow' AND GroveRun IS NOT NULL")
    return [
        {
            "run_id": wf.id,
            "workflow_status": wf.status.name if wf.status else "UNKNOWN",
            "run_status": _attr(wf, "GroveStatus"),
            "step": _attr(wf, "GroveStep"),
            "started": wf.start_time.isoformat(),
        }
        for wf in runs
    ]


# ------------------------------------------------------------------------------------------ cancel


async def cancel_run(client: Client, run_id: str) -> dict[str, Any]:
    handle = client.get_workflow_handle(run_id)
    desc = await _describe(handle)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return {"run_id": run_id, "requested": False, "workflow_status": desc.status.name}
    try:
        await handle.signal("cancel")
    except RPCError as err:
        raise _unreachable_or(err) from err
    return {
        "run_id": run_id,
        "requested": True,
        "workflow_status": "RUNNING",
        "step": _attr(desc, "GroveStep"),
        "note": "the step in progress finishes (episodes settle, checkpoint commits); no new step starts",
    }


# ------------------------------------------------------------------------------------------ episodes


async def step_episodes(client: Client, run_id: str, step: int, missing_ok: bool = False) -> list[dict]:
    """Every episode of one step: id, task, status, reward, rows, failure reason."""
    await _describe(client.get_workflow_handle(run_id))  # a clear not-found for an unknown run
    query = f"WorkflowType = 'EpisodeWorkflow' AND {run_clause(run_id)} AND GroveStep = {int(step)}"
    found = [wf for wf in await _list(client, query) if of_run(wf, run_id)]
    if not found and not missing_ok:
        raise RunNotFoundError(f"run {run_id!r} has no episodes at step {step} (not started yet?)")
    return [await _episode_row(client, wf) for wf in found]


async def _episode_row(client: Client, wf: WorkflowExecution) -> dict[str, Any]:
    row: dict[str, Any] = {
        "episode_id": wf.id,
        "eval": "/eval/" in wf.id,  # a held-out evaluation episode (workflows/evaluation.py)
        "task_id": _attr(wf, "GroveTask"),
        "workflow_status": wf.status.name if wf.status else "UNKNOWN",
        "status": "running",
        "reward": None,
        "num_rows": None,
        "eligible_tokens": None,
        "failed": False,
        "failure": None,
    }
    if wf.status == WorkflowExecutionStatus.RUNNING:
        return row
    handle = client.get_workflow_handle(wf.id, result_type=EpisodeResult)
    try:
        res: EpisodeResult = await handle.result()
    except WorkflowFailureError as err:
        return row | {"status": "failed", "failed": True, "failure": _cause(err)}
    return row | {
        "status": res.status,
        "reward": res.reward,
        "num_rows": res.num_rows,
        "eligible_tokens": res.eligible_tokens,
        "failed": res.status != "ok",
        "failure": res.failure,
    }
