"""`grove run ...`: start, inspect and stop training runs from YAML run configs.

Thin shells: config loading is grove/runconfig.py, talking to Temporal is cli/runs.py. Exit codes
(for scripts; `--json` prints one JSON document on stdout):

    0  ok                     3  invalid run config (file, override or validation)
    1  the run failed         4  run (or step) not found
    2  usage error (typer)    5  Temporal server unreachable
                              6  the run id exists in a state the request cannot use
                                 (other config; failed or terminated)
                              8  `check`: some episode's rows fail the check
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import typer

from grove import runconfig
from grove.store_layout import step_records_prefix

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_INVALID_CONFIG = 3
EXIT_NOT_FOUND = 4
EXIT_UNREACHABLE = 5
EXIT_CONFLICT = 6
EXIT_ROWS_INVALID = 8

run_app = typer.Typer(
    help="Start, inspect and stop training runs (RunConfig YAML files; see `grove run schema`).",
    no_args_is_help=True,
)


Overrides = Annotated[
    list[str] | None,
    typer.Argument(help="dotted.path=value overrides, e.g. learner.lr=3e-4 (values are YAML)."),
]


def _emit(data: Any, as_json: bool, text: str) -> None:
    typer.echo(json.dumps(data, indent=2, default=str) if as_json else text)


@run_app.command("schema")
def schema(
    as_json: bool = typer.Option(False, "--json", help="The JSON schema instead of the table."),
) -> None:
    """Print every RunConfig field: dotted path, type, default and meaning."""
    typer.echo(runconfig.json_schema() if as_json else runconfig.describe_schema())


class EngineLimitsConfigError(runconfig.RunConfigError):
    """The run's engine limits do not fit its model (e.g. a context past the model's positions)."""


def _load_checked(config: str, overrides: list[str] | None) -> Any:
    """Load, override, validate, then check the engine limits against the model (typed errors)."""
    from cli import runs
    from models.limits import EngineLimitsError

    cfg = runconfig.load_run_config(config, overrides or [])
    try:
        runs.check_run_engine(cfg)
    except EngineLimitsError as err:
        raise EngineLimitsConfigError(f"invalid run config {config}: {err}") from err
    return cfg


@run_app.command("validate")
def validate(
    config: str = typer.Argument(..., help="Run config YAML file."),
    overrides: Overrides = None,
    as_json: bool = typer.Option(False, "--json", help="Print the validated config as JSON."),
) -> None:
    """Load a run config with its overrides and print it validated (nothing is started)."""
    try:
        cfg = _load_checked(config, overrides)
    except runconfig.RunConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(EXIT_INVALID_CONFIG) from None
    _emit(cfg.model_dump(mode="json"), as_json, cfg.model_dump_json(indent=2))


# ------------------------------------------------------------------------------------------ server commands

Address = Annotated[
    str | None,
    typer.Option(help="Temporal address (default $GROVE_TEMPORAL_ADDRESS or 127.0.0.1:7233)."),
]
Json = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (for scripts).")]


def _call(as_json: bool, work: Callable[[Any], Awaitable[tuple[Any, str, int]]], address: str | None) -> None:
    """Connect, run `work(client)` -> (data, text, exit code), print; map typed errors to exit codes."""
    from cli import runs

    async def main() -> tuple[Any, str, int]:
        return await work(await runs.open_client(address))

    codes = {
        runs.RunNotFoundError: EXIT_NOT_FOUND,
        runs.ServerUnreachableError: EXIT_UNREACHABLE,
        runs.RunConflictError: EXIT_CONFLICT,
        runs.RunFailedError: EXIT_RUN_FAILED,
    }
    try:
        data, text, code = asyncio.run(main())
    except tuple(codes) as err:
        code = next(c for kind, c in codes.items() if isinstance(err, kind))
        if as_json:
            typer.echo(json.dumps({"error": type(err).__name__, "message": str(err)}))
        typer.echo(f"error: {err}", err=True)
        _exit_now(code)
    _emit(data, as_json, text)
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit without interpreter finalization once the output is flushed.

    The Temporal client's native runtime threads can still hold the GIL machinery while Python
    finalizes, which aborts the process (SIGABRT, "PyGILState_Release ... finalizing") after the
    command already did its work; a command's exit code must be its result, never that race.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@run_app.command("start")
def start(
    config: str = typer.Argument(..., help="Run config YAML file (see examples/ and `grove run schema`)."),
    overrides: Overrides = None,
    wait: bool = typer.Option(False, "--wait", help="Wait for the run to finish and print its steps."),
    address: Address = None,
    as_json: Json = False,
) -> None:
    """Start a run, or re-attach to / resume the run with the same run_id."""
    from cli import runs

    try:
        cfg = _load_checked(config, overrides)
    except runconfig.RunConfigError as err:
        if as_json:
            typer.echo(json.dumps({"error": type(err).__name__, "message": str(err)}))
        typer.echo(str(err), err=True)
        raise typer.Exit(EXIT_INVALID_CONFIG) from None

    async def work(client):
        out = await runs.start_run(client, cfg)
        data = out.as_dict()
        text = f"{out.action} run {out.run_id} at step {out.next_step} of {out.steps}\n  ui: {out.ui}"
        if wait and out.handle is not None:
            result = await runs.wait_run(out.handle)
            data["result"] = result.model_dump(mode="json")
            text += "\n" + _history_text(result) + ("\n  (cancelled)" if result.cancelled else "")
        return data, text, EXIT_OK

    _call(as_json, work, address)


@run_app.command("status")
def status(
    run_id: str = typer.Argument(..., help="Run id."), address: Address = None, as_json: Json = False
) -> None:
    """Step, last metrics, failed episodes (with reasons) and the UI link of a run."""
    from cli import runs

    async def work(client):
        s = await runs.run_status(client, run_id)
        lines = [
            f"run {s['run_id']}: {s['run_status'] or '?'} ({s['workflow_status']}), "
            f"step {s['step']}, {s['steps_done']}/{s['steps'] or '?'} steps done",
        ]
        if s["last"]:
            last = s["last"]
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(last["metrics"].items()))
            lines.append(
                f"  last step {last['step']}: mean reward {last['mean_reward']:.4f}, "
                f"{last['episodes']} episodes ({last['failed_episodes']} failed), "
                f"version {last['policy_version']}"
            )
            if metrics:
                lines.append(f"    {metrics}")
            # episode statistics: reward spread, size, tool-call validity, compactions
            rollout = ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.get("rollout", {}).items()))
            if rollout:
                lines.append(f"    rollout: {rollout}")
        lines += _live_lines(s.get("live"))
        if not s["progress_available"]:
            lines.append("  (no worker answered the progress query: is `grove worker` running?)")
        for e in s["failed_episodes"]:
            lines.append(f"  failed {e['episode_id']}: {e['failure']}")
        lines.append(f"  ui: {s['ui']}")
        return s, "\n".join(lines), EXIT_OK

    _call(as_json, work, address)


def _live_lines(live: dict | None) -> list[str]:
    """The run's moving parts from its progress query: learner, rollouts, lag, every engine."""
    if not live:
        return []
    training = live["training_step"]
    lines = [
        f"  learner: {'training step ' + str(training) if training else 'idle'}, committed version "
        f"{live['committed_version']}; rolling out steps {live['rolling_out'] or '-'}; lag {live['lag']} "
        f"(max_policy_lag {live['max_policy_lag']})"
    ]
    for e in live["engines"]:
        busy = e["busy_s"] / e["up_s"] if e["up_s"] else 0.0
        lines.append(
            f"  engine {e['engine_id']} ({e['queue']}): run {e['run_id'] or '-'} version {e['version']}, "
            f"{e['in_flight']} in flight{', loading weights' if e['publishing'] else ''}, "
            f"{e['calls']} calls, "
            f"busy {busy:.0%} (as of step {live['engines_as_of_step']})"
        )
    return lines


@run_app.command("list")
def list_(address: Address = None, as_json: Json = False) -> None:
    """Every run on the server (visibility query on GroveRun), latest execution of each."""
    from cli import runs

    async def work(client):
        rows = await runs.list_runs(client)
        text = "\n".join(
            f"{r['run_id']:32} {r['run_status'] or '-':10} step {r['step'] or '-':<6} "
            f"{r['workflow_status']:10} {r['started']}"
            for r in rows
        )
        return rows, text or "no runs", EXIT_OK

    _call(as_json, work, address)


@run_app.command("cancel")
def cancel(
    run_id: str = typer.Argument(..., help="Run id."), address: Address = None, as_json: Json = False
) -> None:
    """Stop a run cleanly: the step in progress finishes, no new step starts (`grove run start` resumes)."""
    from cli import runs

    async def work(client):
        out = await runs.cancel_run(client, run_id)
        if out["requested"]:
            text = f"cancel requested for {run_id}: step {out['step']} finishes, then the run stops"
        else:
            text = f"run {run_id} is {out['workflow_status']}: nothing to cancel"
        return out, text, EXIT_OK

    _call(as_json, work, address)


@run_app.command("episodes")
def episodes(
    run_id: str = typer.Argument(..., help="Run id."),
    step: int = typer.Option(..., "--step", help="The step whose episodes to show (1-based)."),
    address: Address = None,
    as_json: Json = False,
) -> None:
    """The episodes of one step: ids, status, reward, row counts, failure reasons."""
    from cli import runs

    async def work(client):
        rows = await runs.step_episodes(client, run_id, step)
        text = "\n".join(
            f"{r['episode_id']:40} {r['status']:8} reward {_num(r['reward'])} rows {_num(r['num_rows'])}"
            + (f"  {r['failure']}" if r["failure"] else "")
            for r in rows
        )
        return rows, text, EXIT_OK

    _call(as_json, work, address)


@run_app.command("view")
def view(
    run_id: str = typer.Argument(..., help="Run id."),
    out: str = typer.Option(None, "--out", help="Folder of the pages (default runs/<run>/view)."),
    episodes_of: Annotated[
        list[int] | None,
        typer.Option("--episodes-of", help="Steps whose episode pages to write (default: the last step)."),
    ] = None,
    address: Address = None,
    as_json: Json = False,
) -> None:
    """Offline HTML pages of a run: reward curves per role, the step table, its episodes' pages
    (cli/episode_view.py; rows and call archives from $GROVE_STORE)."""
    from pathlib import Path

    from cli.episode_view import write_run_pages
    from storage.config import store_from_env

    folder = Path(out or f"runs/{run_id}/view")

    async def work(client):
        index, pages = await write_run_pages(client, store_from_env(), run_id, folder, episodes_of)
        data = {"index": str(index), "episode_pages": [str(p) for p in pages]}
        return data, f"run page {index}  ({len(pages)} episode pages under {folder / 'episodes'})", EXIT_OK

    _call(as_json, work, address)


@run_app.command("check")
def check(
    run_id: str = typer.Argument(..., help="Run id."),
    steps: Annotated[
        list[int] | None,
        typer.Option("--step", help="A step to check (repeatable; default: every recorded step)."),
    ] = None,
    address: Address = None,
    as_json: Json = False,
) -> None:
    """Hold every row of the run's completed episodes against their call archives: tokens as served,
    loss once per trained call, spawn and rewrite links (cli/row_audit.py). Exit 8 when any fails."""
    from dataclasses import asdict

    from cli.row_check import check_run, report
    from storage.config import store_from_env

    async def work(client):
        audits, unchecked = await check_run(client, store_from_env(), run_id, steps)
        text, failing = report(audits, unchecked)
        data = {"episodes": [asdict(a) for a in audits], "not_completed": unchecked, "failing": failing}
        return data, text, EXIT_ROWS_INVALID if failing else EXIT_OK

    _call(as_json, work, address)


def _num(value: float | int | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def _history_text(result) -> str:
    lines = [
        f"  step {r.step}: mean reward {r.mean_reward:.4f}, "
        f"{r.episodes} episodes ({r.failed_episodes} failed)"
        for r in result.history
    ]
    if result.history_from > 1:  # a run longer than carried_history_steps: the rest is in the store
        key = step_records_prefix(result.run_id)
        lines.insert(0, f"  steps 1-{result.history_from - 1}: records in the object store under {key}")
    return "\n".join(lines)
