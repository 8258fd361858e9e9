"""Management routes of an episode: `POST /episodes/{episode_ref}/close` ends the external harness's part."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.deps import CaptureDep, EpisodeIdDep, EpisodesDep
from grove.contracts import CloseRequest, EpisodeResult

router = APIRouter(prefix="/episodes/{episode_ref}", tags=["manage"])


class CloseResponse(BaseModel):
    episode_id: str
    closing: bool = True
    result: EpisodeResult | None = None  # with ?wait=true: the finished episode


@router.post("/close")
async def close_episode(
    episode_id: EpisodeIdDep,
    episodes: EpisodesDep,
    capture: CaptureDep,
    body: CloseRequest | None = None,
    wait: bool = False,
) -> CloseResponse:
    """The harness is done: responses it never got whole are discarded (gateway/capture.py
    settle_undelivered), then the workflow settles its calls, scores, materializes rows, cleans staging."""
    await episodes.spec(episode_id)  # only external episodes are closed from here
    await capture.settle_undelivered(episode_id)
    await episodes.close(episode_id, body or CloseRequest())
    result = await episodes.result(episode_id) if wait else None
    return CloseResponse(episode_id=episode_id, result=result)
