"""`GET /healthz`: liveness; `GET /readyz`: whether grove's workers serve episodes. Neither needs auth.

`/readyz` asks Temporal which workers poll the `episodes` queue (episode workflows) and the inference
queue (`?inference_queue=`, default `inference`; polled only by a worker whose engine is loaded):
200 with `ready: true` when both have a live worker, else 503 with `waiting_for` naming the queues
(grove/queue_readiness.py). A request sent before that still works: it waits for the worker
(gateway/temporal/worker_wait.py); `/readyz` is for a harness or a script that would rather wait first.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from grove import queues
from grove.queue_readiness import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, inference_queue: str = queues.INFERENCE) -> JSONResponse:
    state = await readiness(request.app.state.episodes.client, inference_queue)
    body = {
        "ready": state.ready,
        "waiting_for": state.waiting_for(),
        "queues": [{"queue": q.queue, "kind": q.kind, "workers": q.workers} for q in state.queues],
    }
    return JSONResponse(body, status_code=200 if state.ready else 503)
