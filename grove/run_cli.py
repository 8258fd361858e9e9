"""`grove run ...`: start, inspect and stop training runs from YAML run configs.

Thin shells: config loading is grove/runconfig.py, talking to Temporal is grove/runs.py. Exit codes
(for scripts; `--json` prints one JSON document on stdout):

    0  ok                     3  invalid run config (file, override or validation)
    1  the run failed         4  run (or step) not found
    2  usage error (typer)    5  Temporal server unreachable
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from grove import runconfig

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_INVALID_CONFIG = 3
EXIT_NOT_FOUND = 4
EXIT_UNREACHABLE = 5

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


@run_app.command("validate")
def validate(
    config: str = typer.Argument(..., help="Run config YAML file."),
    overrides: Overrides = None,
    as_json: bool = typer.Option(False, "--json", help="Print the validated config as JSON."),
) -> None:
    """Load a run config with its overrides and print it validated (nothing is started)."""
    try:
        cfg = runconfig.load_run_config(config, overrides or [])
    except runconfig.RunConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(EXIT_INVALID_CONFIG) from None
    _emit(cfg.model_dump(mode="json"), as_json, cfg.model_dump_json(indent=2))
