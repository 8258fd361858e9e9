"""Management routes of an episode: `POST /episodes/{episode_ref}/close` ends the external harness's part."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.http.deps import CaptureDep, CloseBodyDep, EpisodeIdDep, EpisodesDep
from gateway.pipeline.delivery import SETTLE_PATIENCE
from grove.contracts import EpisodeResult

router = APIRouter(prefix="/episodes/{episode_ref}", tags=["manage"])


class CloseResponse(BaseModel):
    episode_id: str
    closing: bool = True
    result: EpisodeResult | None = None  # with ?wait=true: the finished episode


@router.post("/close")
async def close_episode(
    episode_id: EpisodeIdDep,
    body: CloseBodyDep,
    episodes: EpisodesDep,
    capture: CaptureDep,
    wait: bool = False,
) -> CloseResponse:
    """The harness is done: the workflow freezes its ledger (a response whose delivery it has not recorded
    is discarded, never trained: ledger/delivery.py), scores, materializes rows, cleans staging.
    The body (a CloseRequest, optional) is read by a dependency after the token check and capped
    (max_close_bytes): a body parameter here would make FastAPI read it whole before auth. Responses this
    gateway has sent have their delivery recorded first (gateway/pipeline/delivery.py): a harness closes right
    after its last response."""
    await episodes.spec(episode_id)  # only external episodes are closed from here
    await capture.deliveries_recorded(episode_id, SETTLE_PATIENCE)
    await episodes.close(episode_id, body)
    result = await episodes.result(episode_id) if wait else None
    return CloseResponse(episode_id=episode_id, result=result)
