"""The capture gateway: an OpenAI-compatible HTTP front that records external harnesses into episodes.

`create_app(settings)` builds the app; its lifespan owns the Temporal client (pydantic data
converter) and the object store. Routers: OpenAI-compatible `/episodes/{ref}/v1/...`
(gateway/http/routes/openai.py), Anthropic Messages `/episodes/{ref}/v1/messages`
(gateway/http/routes/anthropic.py), management `/episodes/{ref}/close`, and `/healthz`. Serve it with
`python -m gateway` (gateway/http/cli.py).

Limits (gateway/intake/limits.py): header count/bytes by middleware before any route; every body read by a
dependency after the bearer token was checked, capped; the served model's tokenizer and context
(gateway/intake/context_window.py) loaded at startup so over-long prompts are refused before admission,
measured off the event loop in a bounded worker pool (gateway/intake/tokenization.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.http.routes import anthropic, health, manage, openai, responses
from gateway.http.routes.errors import install_error_handlers
from gateway.http.settings import GatewaySettings
from gateway.intake.body_parse import BodyParser
from gateway.intake.context_window import ContextWindow
from gateway.intake.large_bodies import BodyAdmission
from gateway.intake.limits import HeaderLimitMiddleware
from gateway.intake.tokenization import Tokenization
from gateway.pipeline.capture import Capture
from gateway.temporal.episode_client import Episodes
from grove.client import connect
from storage.base import ObjectStore
from storage.config import open_store


def create_app(settings: GatewaySettings, store: ObjectStore | None = None) -> FastAPI:
    """The gateway app; `store`: an opened object store to use instead of opening `settings.store`
    (a gateway embedded in a worker shares the worker's)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = await connect(settings.temporal_address, settings.namespace)
        nonlocal store
        if store is None:
            store = await asyncio.to_thread(open_store, settings.store)
        window = await asyncio.to_thread(
            ContextWindow.load, settings.policy_model, settings.max_model_len, store
        )
        tokens = Tokenization(window, settings.policy_model, settings.tokenization)
        app.state.episodes = Episodes(client, settings.worker_wait_s)
        app.state.capture = Capture(app.state.episodes, store, window, tokens)
        app.state.body_parser.bound = tokens.bound  # large bodies' worker processes refuse by it too
        try:
            yield
        finally:
            await asyncio.to_thread(app.state.body_parser.shutdown)
            await asyncio.to_thread(tokens.shutdown)

    app = FastAPI(title="grove capture gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.body_admission = BodyAdmission(settings.bodies)
    app.state.body_parser = BodyParser(settings.bodies.processes, settings.bodies.retry_after)
    app.add_middleware(HeaderLimitMiddleware, limits=settings.limits)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(manage.router)
    return app
