"""`grove episode ...`: one episode by hand, outside a run — for a harness you run yourself.

    grove episode start --external [--task 3] [--gateway-url http://127.0.0.1:8400] [--max-tokens 64]

starts an `EpisodeWorkflow` driven by an external harness and prints what the harness needs: the
OpenAI base URL of the episode on the gateway and its bearer token (the OpenAI client's api_key),
signed with $GROVE_GATEWAY_SECRET (the gateway's own secret), plus the close URL. Point any OpenAI
client (OpenCode's provider `baseURL`/`apiKey`) at them, then close the episode:

    curl -X POST -H "authorization: Bearer $TOKEN" "$CLOSE_URL?wait=true" -d '{"final_answer": "..."}'

Exit codes: 0 ok, 2 usage, 5 Temporal unreachable, 6 the episode id exists already.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

import typer

episode_app = typer.Typer(
    help="Start episodes by hand (for a harness you run yourself).", no_args_is_help=True
)

EXIT_UNREACHABLE = 5
EXIT_CONFLICT = 6


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
    max_tokens: int = typer.Option(256, help="Default max_tokens of the episode's calls."),
    idle_timeout_s: float = typer.Option(1800.0, help="Close as failed after this long without a call."),
    address: str = typer.Option(None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Start an episode for a hand-run harness; print its base URL and token."""
    from gateway.auth import issue_token
    from gateway.episode_ref import episode_ref
    from gateway.settings import SECRET_VAR

    if not external:
        typer.echo("only external episodes start by hand: pass --external", err=True)
        raise typer.Exit(2)
    secret = os.environ.get(SECRET_VAR)
    if not secret:
        typer.echo(f"{SECRET_VAR} is not set: use the secret the gateway was started with", err=True)
        raise typer.Exit(2)
    eid = episode_id or f"adhoc/{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_start(eid, task_family, task, max_tokens, idle_timeout_s, address))
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
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            typer.echo(f"{key:11} {value}")
    _exit_now(0)


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


async def _start(
    eid: str, family_name: str, index: int, max_tokens: int, idle_timeout_s: float, address: str | None
) -> None:
    from grove.client import connect
    from grove.contracts import EpisodeSpec, HarnessSpec
    from grove.episode_start import EpisodeIdReusedError, start_episode
    from grove.sampling import SamplingConfig
    from harnesses.programs import family

    make_task, _ = family(family_name)
    spec = EpisodeSpec(
        run_id="adhoc", step=0, group_id=f"{eid}/group", episode_id=eid, task=make_task(index),
        harness=HarnessSpec(kind="external"), sampling=SamplingConfig(max_tokens=max_tokens),
        idle_timeout_s=idle_timeout_s,
    )  # fmt: skip
    try:
        client = await connect(address)
    except RuntimeError as err:
        raise _Unreachable(f"Temporal is unreachable: {err}") from None
    try:
        await start_episode(client, spec)
    except (
        EpisodeIdReusedError
    ) as err:  # running, or ended: an id is never used twice (grove/episode_start.py)
        raise _Conflict(f"{err}; pick another --id") from None
