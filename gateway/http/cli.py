"""`python -m gateway` / the `gateway` command: serve the capture gateway with uvicorn.

Registered in cli/main.py as `grove gateway`.
"""

from __future__ import annotations

import typer


def gateway(
    host: str = typer.Option("127.0.0.1", help="Interface to bind (default: loopback only)."),
    port: int = typer.Option(8400, help="Port to serve on."),
    address: str = typer.Option(
        None, help="Temporal address (default $GROVE_TEMPORAL_ADDRESS or 127.0.0.1:7233)."
    ),
    store: str = typer.Option(None, help="Object store URL or path (default $GROVE_STORE)."),
    model_name: str = typer.Option(
        None, help="Model id clients send (default $GROVE_GATEWAY_MODEL or 'grove')."
    ),
    policy_model: str = typer.Option(
        None,
        help="The model the run's engines serve, as `grove worker --model` (default "
        "$GROVE_GATEWAY_POLICY_MODEL or 'tiny'): its tokenizer measures every prompt.",
    ),
    max_model_len: int = typer.Option(
        None, help="The engines' context in tokens (default $GROVE_GATEWAY_MAX_MODEL_LEN or 2048)."
    ),
    worker_wait_s: float = typer.Option(
        None,
        help="How long a request waits for a grove worker to poll its episode's queue before a 503 "
        "(default $GROVE_GATEWAY_WORKER_WAIT_S or 600).",
    ),
) -> None:
    """Serve the OpenAI-compatible capture gateway (secret from $GROVE_GATEWAY_SECRET)."""
    import uvicorn

    from gateway.http.app import create_app
    from gateway.http.settings import GatewaySettings
    from gateway.http.slow_clients import head_timeout_protocol
    from models.limits import EngineLimitsError, check_positions
    from models.registry import known_positions

    settings = GatewaySettings.from_env(
        temporal_address=address,
        store=store,
        model_name=model_name,
        host=host,
        port=port,
        policy_model=policy_model,
        max_model_len=max_model_len,
        worker_wait_s=worker_wait_s,
    )
    try:  # refuse a context past the model's positions before serving (the app checks the folder again)
        where = f"gateway for model {settings.policy_model!r}"
        check_positions(settings.max_model_len, known_positions(settings.policy_model), where)
    except EngineLimitsError as err:
        typer.echo(f"gateway: {type(err).__name__}: {err}", err=True)
        raise typer.Exit(2) from None
    protocol = head_timeout_protocol(settings.limits.header_timeout_s)  # gateway/http/slow_clients.py
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, http=protocol)


def main() -> None:
    typer.run(gateway)
