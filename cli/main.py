"""The `grove` command line: local infrastructure, models, workers, runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from models.names import models_help

app = typer.Typer(help="grove: GRPO on multi-agent rollouts, durable on Temporal.", no_args_is_help=True)
infra_app = typer.Typer(help="Start, stop and inspect the local services (Temporal dev server, S3).")
model_app = typer.Typer(help="Build or convert the policy model folders grove trains.")
app.add_typer(infra_app, name="infra")
app.add_typer(model_app, name="model")


def _register_runs() -> None:
    from cli.episode_commands import episode_app
    from cli.run_commands import run_app

    app.add_typer(run_app, name="run")
    app.add_typer(episode_app, name="episode")


_register_runs()


@infra_app.command("up")
def infra_up(
    port: int = typer.Option(7233, help="Temporal frontend gRPC port (127.0.0.1)."),
    ui: bool = typer.Option(True, help="Serve the Temporal Web UI."),
    ui_port: int = typer.Option(8233, help="Temporal Web UI port."),
    s3: bool = typer.Option(False, help="Also start a local S3-compatible server (localbucket)."),
    s3_port: int = typer.Option(9000, help="S3 server port."),
) -> None:
    """Start the Temporal dev server (SQLite under $GROVE_HOME/infra) and optionally an S3 server."""
    from infra import stack
    from infra.procs import ServiceStartError

    try:
        rec = stack.up_temporal(port=port, ui=ui, ui_port=ui_port)
    except ServiceStartError as exc:  # TemporalDatabaseInUseError among them: the message says what to do
        typer.echo(f"infra up: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"temporal  pid {rec.pid}  address {rec.address}  ui {rec.ui_url or '-'}  log {rec.log}")
    if s3:
        rec = stack.up_s3(port=s3_port)
        typer.echo(f"s3        pid {rec.pid}  endpoint {rec.address}  log {rec.log}")


@infra_app.command("down")
def infra_down() -> None:
    """Stop the services `grove infra up` started (by their recorded PIDs)."""
    from infra import stack

    stopped = stack.down()
    typer.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@infra_app.command("status")
def infra_status(
    queue: Annotated[
        list[str] | None,
        typer.Option(help="Another task queue to report (a run's own inference queue); repeatable."),
    ] = None,
) -> None:
    """Show the recorded services, whether each is alive, and which task queues a worker polls."""
    import asyncio

    from cli.queue_status import queue_lines
    from infra import stack

    services = stack.status()
    if not services:
        typer.echo("no services recorded (run `grove infra up`)")
    for name, (rec, alive) in services.items():
        typer.echo(f"{name:9} {'up  ' if alive else 'DOWN'} pid {rec.pid}  {rec.address}  {rec.ui_url or ''}")
    temporal = services.get("temporal")
    if temporal is not None and temporal[1]:
        from cli.run_commands import _exit_now

        for line in asyncio.run(queue_lines(temporal[0].address, queue or [])):
            typer.echo(line)
        _exit_now(0)  # the Temporal client's threads can abort a finalizing interpreter (run_commands.py)


@model_app.command("init")
def model_init(
    name: str = typer.Argument("tiny", help=models_help("The model to build")),
) -> None:
    """Build (or convert) a model folder and print its path; cached under $GROVE_MODELS (default
    ~/.cache/grove/models, shared by every stack whatever its $GROVE_HOME)."""
    from models.progress import listen_to_progress
    from models.registry import ensure_model

    listen_to_progress(lambda line: typer.echo(line, err=True))  # step, loss, ETA of each build
    path: Path = ensure_model(name)
    typer.echo(str(path))


@app.command("worker")
def worker(
    queues: str = typer.Option("episodes,io,trainer,inference", help="Comma-separated task queues to serve."),
    model: str = typer.Option("tiny", help=models_help("Model for the inference engine")),
    address: str = typer.Option(
        None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS or 127.0.0.1:7233)."
    ),
    device: str = typer.Option(None, help="Learner device (default: cuda if available, else cpu)."),
    inference_queue: str = typer.Option(
        "inference", help="Task queue name of this worker's engine (one per concurrently training run)."
    ),
    gateway_url: str = typer.Option(
        None,
        help="harness queue: the capture gateway the launched harnesses talk to (secret from "
        "$GROVE_GATEWAY_SECRET); default: serve an embedded gateway in this worker.",
    ),
    harness_dir: str = typer.Option(
        None, help="harness queue: folder of the launched harnesses' episode folders (default: a temp dir)."
    ),
    keep_harness_dirs: bool = typer.Option(
        False, help="harness queue: keep finished episodes' folders (events.jsonl, stderr.log)."
    ),
    tool_call_parser: str = typer.Option(
        "hermes",
        help="The model family's tool-call format: grove's 'hermes' or a vLLM --tool-call-parser name "
        "(qwen3_coder, llama3_json, mistral, pythonic, ...).",
    ),
    max_model_len: int = typer.Option(
        None,
        help="Engine context in tokens, prompt + completion (default 2048; at most the model's positions).",
    ),
    max_num_batched_tokens: int = typer.Option(
        None, help="Tokens one engine step may schedule (default max(max_model_len, 2048))."
    ),
    kv_cache_bytes: int = typer.Option(None, help="Engine KV cache size in bytes (default 256 MiB)."),
    wedge_sweep_s: float = typer.Option(
        60.0,
        min=0.0,
        help="episodes queue: every this many seconds, terminate running episodes whose workflow task "
        "failed 3 times in a row (the server's TemporalReportedProblems), so their steps go on; 0: never.",
    ),
) -> None:
    """Serve grove's task queues (one process can serve all of them on a single machine)."""
    import asyncio
    import signal

    from pydantic import ValidationError

    from cli.worker import engine_limits, parse_queues, run_worker
    from grove.client import connect
    from models.limits import EngineLimitsError, check_positions
    from models.registry import known_positions
    from storage.config import store_from_env

    names = parse_queues(queues)
    try:
        limits = engine_limits(
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_bytes=kv_cache_bytes,
        )
        if "inference" in names:  # refuse a context past the model's positions before connecting
            check_positions(
                limits.max_model_len, known_positions(model), f"worker engine for model {model!r}"
            )
    except (ValidationError, EngineLimitsError) as err:
        typer.echo(f"worker: {err}", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        # SIGTERM cancels the worker so run_worker's cleanup shuts the vLLM engine down (its engine
        # processes would otherwise outlive a terminated worker).
        task = asyncio.current_task()
        if task is None:  # asyncio.run runs main() as a task
            raise RuntimeError("the worker's main() must run as an asyncio task")
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        client = await connect(address)
        typer.echo(f"worker: queues {names} on {client.service_client.config.target_host}")
        from activities.harness import HarnessWorkerOptions

        await run_worker(
            client, names, store=store_from_env(), model=model, device=device,
            inference_queue=inference_queue, wedge_sweep_s=wedge_sweep_s or None, say=typer.echo,
            sigterm_stops_loading=True,
            engine_config={"tool_call_parser": tool_call_parser, **limits.model_dump()},
            harness=HarnessWorkerOptions(
                gateway_url=gateway_url, policy_model=model, keep_dirs=keep_harness_dirs,
                root=Path(harness_dir) if harness_dir else None,
                max_model_len=limits.max_model_len,  # the embedded gateway measures with the engine's context
            ),
        )  # fmt: skip

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        typer.echo("worker stopped")
    except EngineLimitsError as err:
        typer.echo(f"worker: {err}", err=True)
        raise typer.Exit(2) from None


@app.command("demo")
def demo(
    harness: str = typer.Option(
        "native",
        help="native: the in-workflow delegation program; opencode: stock OpenCode launched per episode "
        "(opencode-delegation family, default model tiny-copy); langgraph / agents-sdk: a LangGraph / "
        "OpenAI Agents SDK program launched per episode (langgraph-delegation / agents-sdk-delegation); "
        "claude-code / codex: stock Claude Code (claude-code-delegation) / Codex CLI (delegation), each "
        "lead starting its workers with its own subagent tool (default model smol-agent).",
    ),
    family: str = typer.Option(
        None,
        help="opencode only: opencode-delegation (default), opencode-reader (each worker reads "
        "notes.txt with OpenCode's read tool and compacts mid-way; default model tiny-reader) or "
        "opencode-report (the same episodes, rewarded for the shape of the workers' reports and the lead's "
        "answer; default model tiny-report).",
    ),
    model: str = typer.Option(
        None,
        help="tiny | tiny-tools | tiny-copy | tiny-resume | tiny-reader | tiny-report | tiny-summary | "
        "smollm2 | smol-agent | a HF causal-LM folder (default tiny; --summaries: tiny-summary; opencode: "
        "tiny-copy, opencode-reader: tiny-reader, opencode-report: tiny-report; claude-code, codex: "
        "smol-agent).",
    ),
    summaries: bool = typer.Option(
        False,
        "--summaries",
        help="native only: the pair trains the workers' summary calls or not (train_auxiliary [summary] vs "
        "[]) on the summary-delegation family, every agent's actions trained in both (model: tiny-summary).",
    ),
    steps: int = typer.Option(20, help="Optimizer steps per run."),
    name: str = typer.Option("demo", help="Run name prefix; the same name resumes the same runs."),
    group_size: int = typer.Option(8, help="Episodes per task (GRPO group)."),
    tasks_per_step: int = typer.Option(2, help="Tasks per step."),
    lr: float = typer.Option(
        None, help="Learning rate (default 5e-4; opencode: 1e-4; claude-code, codex: 1e-5)."
    ),
    kl_coef: float = typer.Option(0.0, help="KL penalty to the start model (learner.kl_coef; 0: off)."),
    max_tokens: int = typer.Option(
        None, help="Max tokens per model call (default 8; opencode: 128; claude-code, codex: 256)."
    ),
    temperature: float = typer.Option(0.7, help="Sampling temperature (recorded per call for the learner)."),
    eval_every: int = typer.Option(5, help="Evaluate on 8 held-out tasks every N steps (0: never)."),
    seed: int = typer.Option(
        0, min=0, help="Data order seed (RunConfig.seed): the tasks of each step, shared by both runs."
    ),
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="dotted.path=value set in both runs' RunConfig (repeatable), e.g. --set "
            "learner.adv_std_scaling=false; run_id, train_agents and inference_queue are the demo's.",
        ),
    ] = None,
    port: int = typer.Option(7233, help="Temporal dev server's port (when the demo starts the server)."),
    ui_port: int = typer.Option(8233, help="Temporal UI's port (when the demo starts the server)."),
    out_dir: str = typer.Option("runs", help="metrics.csv, reward.png and logs go to OUT_DIR/NAME."),
) -> None:
    """Parent+worker GRPO on the delegation task beside the parent-only baseline, on the real stack."""
    from cli.demo import HARNESSES, OPENCODE_MODELS, DemoConfig, main, model_name, run_configs
    from grove.runconfig import RunConfigError

    if harness not in HARNESSES:
        typer.echo(f"demo: --harness {harness!r}: expected one of {', '.join(HARNESSES)}", err=True)
        raise typer.Exit(2)
    if family is not None and (harness != "opencode" or family not in OPENCODE_MODELS):
        typer.echo(
            f"demo: --family {family!r}: only with --harness opencode, one of {', '.join(OPENCODE_MODELS)}",
            err=True,
        )
        raise typer.Exit(2)
    if summaries and harness != "native":
        typer.echo("demo: --summaries: only with --harness native (the summary-delegation family)", err=True)
        raise typer.Exit(2)
    cfg = DemoConfig(
        name=name, harness=harness, family=family, summaries=summaries, model=model, steps=steps,
        group_size=group_size, tasks_per_step=tasks_per_step, lr=lr, kl_coef=kl_coef, max_tokens=max_tokens,
        temperature=temperature, eval_every=eval_every, seed=seed, overrides=overrides or [], port=port,
        ui_port=ui_port, out_dir=Path(out_dir),
    )  # fmt: skip
    try:  # before anything starts: the model is built and the server started only for a valid pair
        run_configs(cfg, Path(model_name(cfg)))
    except RunConfigError as err:
        typer.echo(f"demo: {err}", err=True)
        raise typer.Exit(2) from err
    raise typer.Exit(main(cfg))


def _register_gateway() -> None:
    from gateway.http.cli import gateway

    app.command("gateway", help="Serve the OpenAI-compatible capture gateway for external harnesses.")(
        gateway
    )


_register_gateway()

if __name__ == "__main__":
    app()
