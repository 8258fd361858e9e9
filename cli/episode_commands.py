"""`grove episode ...`: one episode by hand, outside a run — for a harness you run yourself.

    grove episode start --external [--task 3] [--gateway-url http://127.0.0.1:8400] [--max-tokens 64]
                        [--temperature 0.7] [--top-p 0.95] [--run-config examples/opencode-delegation.yaml]

starts an `EpisodeWorkflow` driven by an external harness and prints what the harness needs: the
OpenAI base URL of the episode on the gateway and its bearer token (the OpenAI client's api_key),
signed with $GROVE_GATEWAY_SECRET (the gateway's own secret), plus the close URL and the episode's
sampling. Point any OpenAI client (OpenCode's provider `baseURL`/`apiKey`) at them, then close the
episode.

Sampling is explicit: a request that names no `temperature` / `top_p` is sampled, and recorded for the
learner, with the episode's (gateway/intake/chat_request.py `sampling_for`; OpenCode sends a temperature only
when its model entry says `"temperature": true` and the agent names one). The episode's sampling is
`--temperature` / `--top-p` / `--max-tokens`, else the run config's `sampling` (`--run-config`), else
grove's defaults (temperature 1.0, top_p 1.0, 256 tokens); it is printed either way:

    curl -X POST -H "authorization: Bearer $TOKEN" "$CLOSE_URL?wait=true" -d '{"final_answer": "..."}'

    grove episode show <episode id>      # its contexts while it runs; its result and rows once closed
    grove episode view <episode id>      # an offline HTML page of it (cli/episode_view.py)
    grove episode check <episode id>     # its rows held against its call archive (cli/row_audit.py)

A running episode whose workflow run is still loading its ledger's pages (after a continue-as-new) is
shown once they are loaded: `show` waits up to `--wait` seconds (grove/ledger_restoring.py).

Exit codes: 0 ok, 2 usage, 4 no such episode (show), 5 Temporal unreachable, 6 the episode id exists
already (start), 7 the episode was still restoring its ledger after `--wait` seconds (show: ask again),
8 its rows fail the check (check).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from functools import partial

import typer

episode_app = typer.Typer(
    help="Start episodes by hand (for a harness you run yourself).", no_args_is_help=True
)

EXIT_NOT_FOUND = 4
EXIT_UNREACHABLE = 5
EXIT_CONFLICT = 6
EXIT_RESTORING = 7
EXIT_ROWS_INVALID = 8
SHOW_WAIT_S = 60.0  # how long `show` waits for a running episode's ledger to be restored


@episode_app.command("start")
def start(
    external: bool = typer.Option(
        False, "--external", help="Driven by a harness you run (the only kind startable by hand)."
    ),
    episode_id: str = typer.Option(None, "--id", help="Episode (workflow) id; default adhoc/<random>."),
    task_family: str = typer.Option("delegation", help="Task family (its reward scores the close)."),
    task: int = typer.Option(0, help="Task index within the family."),
    gateway_url: str = typer.Option(
        "http://127.0.0.1:8400", help="The gateway the harness talks to (`grove gateway`)."
    ),
    max_tokens: int = typer.Option(
        None, help="max_tokens of calls that name none (default: the run config's, else 256)."
    ),
    temperature: float = typer.Option(
        None, help="Temperature of calls that name none (default: the run config's, else 1.0)."
    ),
    top_p: float = typer.Option(
        None, help="top_p of calls that name none (default: the run config's, else 1.0)."
    ),
    run_config: str = typer.Option(
        None, help="A run config (YAML) whose `sampling` the episode takes, like the run's episodes."
    ),
    idle_timeout_s: float = typer.Option(1800.0, help="Close as failed after this long without a call."),
    address: str = typer.Option(None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Start an episode for a hand-run harness; print its base URL and token."""
    from gateway.http.auth import issue_token
    from gateway.http.episode_ref import episode_ref
    from gateway.http.settings import SECRET_VAR

    if not external:
        typer.echo("only external episodes start by hand: pass --external", err=True)
        raise typer.Exit(2)
    secret = os.environ.get(SECRET_VAR)
    if not secret:
        typer.echo(f"{SECRET_VAR} is not set: use the secret the gateway was started with", err=True)
        raise typer.Exit(2)
    try:
        sampling = episode_sampling(run_config, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    except (ValueError, OSError) as err:  # pydantic's ValidationError and RunConfigError are ValueErrors
        typer.echo(f"episode start: {err}", err=True)
        raise typer.Exit(2) from None
    eid = episode_id or f"adhoc/{uuid.uuid4().hex[:12]}"
    from grove.contracts import EpisodeSpecError
    from harnesses.programs import UnknownTaskFamilyError

    try:  # every setting and the id are checked here, before Temporal is asked (grove/ids.py)
        spec = episode_spec(eid, task_family, task, sampling, idle_timeout_s)
    except (EpisodeSpecError, UnknownTaskFamilyError, ValueError, IndexError) as err:
        typer.echo(f"episode start: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(_start(spec, address))
    except _Conflict as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_CONFLICT)
    except _Unreachable as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_UNREACHABLE)
    base = gateway_url.rstrip("/")
    out = {
        "episode_id": eid,
        "base_url": f"{base}/episodes/{episode_ref(eid)}/v1",
        "token": issue_token(secret, eid),
        "close_url": f"{base}/episodes/{episode_ref(eid)}/close",
        "sampling": sampling.model_dump(include={"temperature", "top_p", "max_tokens"}),
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            if key == "sampling":
                value = " ".join(f"{k}={v}" for k, v in value.items())
                value += "  (requests naming no temperature/top_p/max_tokens get these)"
            typer.echo(f"{key:11} {value}")
    _exit_now(0)


def episode_sampling(
    run_config: str | None, *, temperature: float | None, top_p: float | None, max_tokens: int | None
):
    """The episode's SamplingConfig: the flags given, over the run config's sampling (or grove's
    defaults). Raises ValueError (pydantic's, naming the field) for values grove cannot sample with."""
    from grove.runconfig import load_run_config
    from grove.sampling import SamplingConfig

    base = load_run_config(run_config).sampling if run_config else SamplingConfig()
    flags = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
    return SamplingConfig.model_validate(
        {**base.model_dump(), **{k: v for k, v in flags.items() if v is not None}}
    )


@episode_app.command("show")
def show(
    episode_id: str = typer.Argument(..., help="The episode (workflow) id `grove episode start` printed."),
    address: str = typer.Option(None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS)."),
    wait: float = typer.Option(
        SHOW_WAIT_S, help="Seconds to wait for a running episode that is restoring its ledger from pages."
    ),
) -> None:
    """What grove recorded of an episode: its contexts (agents, spawns, rewrites) while it runs; its
    result, contexts and rows once it is closed (from $GROVE_STORE)."""
    try:
        lines = asyncio.run(_show(episode_id, address, wait, _restoring_notice(wait)))
    except _Restoring as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_RESTORING)
    except _Unreachable as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_UNREACHABLE)
    except _NotFound as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_NOT_FOUND)
    for line in lines:
        typer.echo(line)
    _exit_now(0)


@episode_app.command("view")
def view(
    episode_id: str = typer.Argument(..., help="The episode (workflow) id."),
    out: str = typer.Option(None, "--out", help="The HTML file to write (default episode-<id>.html)."),
    model: str = typer.Option(
        None, help="Whose tokenizer shows the tokens (default: the run's model, else tiny; never built)."
    ),
    address: str = typer.Option(None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS)."),
) -> None:
    """Write an offline HTML page of an episode: agent tree, calls, tokens, rows, reward, advantage
    (cli/episode_view.py; rows and the call archive from $GROVE_STORE)."""
    from pathlib import Path

    from cli.episode_view import EpisodeNotFoundError, page_name, write_episode_page
    from storage.config import store_from_env

    path = Path(out or f"episode-{page_name(episode_id)}")
    data = _connected(
        address,
        lambda client: write_episode_page(client, store_from_env(), episode_id, path, model),
        EpisodeNotFoundError,
    )
    typer.echo(f"episode page {path}  ({len(data['calls'])} calls, {len(data['rows'])} rows)")
    _exit_now(0)


@episode_app.command("check")
def check(
    episode_id: str = typer.Argument(..., help="The episode (workflow) id; it must be completed."),
    address: str = typer.Option(None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS)."),
) -> None:
    """Hold the closed episode's rows against its call archive: tokens as served, loss once per trained
    call, spawn and rewrite links (cli/row_audit.py; from $GROVE_STORE). Exit 8 when any check fails."""
    from cli.row_check import EpisodeNotClosedError, check_episode, report
    from storage.config import store_from_env

    audit = _connected(
        address, lambda client: check_episode(client, store_from_env(), episode_id), EpisodeNotClosedError
    )
    text, failing = report([audit], [])
    typer.echo(text)
    _exit_now(EXIT_ROWS_INVALID if failing else 0)


async def _client(address: str | None):
    """A connected Temporal client, else _Unreachable."""
    from grove.client import connect

    try:
        return await connect(address)
    except RuntimeError as err:
        raise _Unreachable(f"Temporal is unreachable: {err}") from None


def _connected(address: str | None, work, not_found: type[Exception]):
    """`work(client)` on a fresh connection; an unreachable server exits 5, `not_found` exits 4 (its
    message on stderr)."""

    async def run():
        return await work(await _client(address))

    try:
        return asyncio.run(run())
    except _Unreachable as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_UNREACHABLE)
    except not_found as err:
        typer.echo(str(err), err=True)
        _exit_now(EXIT_NOT_FOUND)


def _exit_now(code: int) -> None:
    """Exit without interpreter finalization (the Temporal client's native threads can abort it;
    cli/run_commands.py _exit_now)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Conflict(Exception):
    pass


class _Unreachable(Exception):
    pass


class _NotFound(Exception):
    pass


class _Restoring(Exception):
    """The episode's run was still loading its ledger's pages after `--wait` seconds."""


def _restoring_notice(wait: float):
    """Says once, on stderr, that `show` waits for a restore (grove/ledger_restoring.py)."""
    said: list[bool] = []

    def notice(err: BaseException) -> None:
        if not said:
            said.append(True)
            typer.echo(f"{getattr(err, 'message', err)}\nwaiting up to {wait:g} s", err=True)

    return notice


def episode_spec(eid: str, family_name: str, index: int, sampling, idle_timeout_s: float):
    """The hand-started episode's EpisodeSpec; EpisodeSpecError names what it refuses."""
    from grove.contracts import EpisodeSpec, HarnessSpec
    from harnesses.programs import family

    make_task, _ = family(family_name)
    return EpisodeSpec(
        run_id="adhoc", step=0, group_id=f"{eid}/group", episode_id=eid, task=make_task(index),
        harness=HarnessSpec(kind="external"), sampling=sampling,
        idle_timeout_s=idle_timeout_s,
    )  # fmt: skip


async def _start(spec, address: str | None) -> None:
    from grove.episode_start import EpisodeIdReusedError, start_episode

    client = await _client(address)
    try:
        await start_episode(client, spec)
    except EpisodeIdReusedError as err:  # running or ended: an id is used once (grove/episode_start.py)
        raise _Conflict(f"{err}; pick another --id") from None


async def _show(eid: str, address: str | None, wait: float = SHOW_WAIT_S, on_restoring=None) -> list[str]:
    """The lines `show` prints; `on_restoring` sees each refusal of a ledger still restoring that is
    waited out (for `wait` seconds at most, then _Restoring)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from cli.episode_show import result_lines, summary_lines
    from grove.contracts import EpisodeResult

    client = await _client(address)
    handle = client.get_workflow_handle(eid, result_type=EpisodeResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise _NotFound(f"no episode {eid!r} on {client.service_client.config.target_host}") from None
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return summary_lines(eid, await _summary_pages(handle, wait, on_restoring))
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        result = await handle.result()
        rows, contexts = await asyncio.to_thread(_closed_records, result)
        return result_lines(result, rows, contexts)
    return [f"episode   {eid}  {desc.status.name if desc.status else 'unknown'}"]


async def _summary_pages(handle, wait: float, on_restoring=None) -> list:
    """Every page of a running episode's `summary` (each answer bounded: ledger/accounting.py), once its
    ledger is restored (asked again for `wait` seconds at most, then _Restoring)."""
    from temporalio.client import WorkflowQueryFailedError

    from grove.ledger_restoring import ask_while_restoring, is_restoring
    from ledger.accounting import LedgerSummary, SummaryPage

    def restoring(err: BaseException) -> bool:
        return isinstance(err, WorkflowQueryFailedError) and is_restoring(err.message)

    async def page(offset: int) -> LedgerSummary:
        ask = partial(handle.query, "summary", SummaryPage(offset=offset), result_type=LedgerSummary)
        try:
            return await ask_while_restoring(ask, restoring, patience=wait, on_wait=on_restoring)
        except WorkflowQueryFailedError as err:
            if not restoring(err):
                raise
            raise _Restoring(f"{err.message}\n(still restoring after {wait:g} s: ask again)") from None

    pages = [await page(0)]
    while pages[-1].next_offset is not None:
        pages.append(await page(pages[-1].next_offset))
    return pages


def _closed_records(result) -> tuple[list, list | None]:
    """A closed episode's rows and context map from the store ($GROVE_STORE); None: no map was written."""
    from activities.episode_map import decode_contexts
    from grove.store_layout import contexts_key
    from storage.base import ObjectNotFoundError
    from storage.config import store_from_env
    from trainer.rows import rows_from_parquet

    store = store_from_env()
    rows = rows_from_parquet(store.get(result.rows_key)) if result.num_rows else []
    try:
        contexts = decode_contexts(store.get(contexts_key(result.episode_id)))
    except ObjectNotFoundError:
        contexts = None
    return rows, contexts
