"""An episode id is used once (grove/episode_start.py): a second start under it, running or ended, is
refused at once with a 409 naming the existing episode.

Before, an external episode started under the id of a finished one ran, and failed only at its
materialization (`DigestMismatchError: rows/... already holds different bytes`). Real dev server, the
session's grove worker closing the first episode.
"""

from __future__ import annotations

import json
import uuid

import pytest

from gateway.http.routes.errors import error_response
from gateway.temporal.episode_client import Episodes
from grove.contracts import CloseRequest, EpisodeSpec, HarnessSpec
from grove.episode_start import EpisodeIdReusedError, start_episode
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import SERVICE_TEST_TIMEOUT

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)


def spec(episode_id: str, task: int) -> EpisodeSpec:
    return EpisodeSpec(
        run_id="adhoc", step=0, group_id=f"{episode_id}/group", episode_id=episode_id,
        task=scenario.make_task(task), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=4),
    )  # fmt: skip


async def test_an_episode_id_is_refused_while_its_episode_runs_and_after_it_ended(
    temporal_client, grove_worker
):
    eid = f"adhoc/{uuid.uuid4().hex[:12]}"
    first = await start_episode(temporal_client, spec(eid, 0))
    with pytest.raises(EpisodeIdReusedError) as running:
        await start_episode(temporal_client, spec(eid, 1))
    assert running.value.status == "RUNNING" and running.value.run_id == first.first_execution_run_id
    episodes = Episodes(temporal_client)
    await episodes.close(eid, CloseRequest(final_answer="done"))
    await episodes.result(eid)  # ended
    with pytest.raises(EpisodeIdReusedError) as ended:
        await start_episode(temporal_client, spec(eid, 2))
    err = ended.value
    assert (err.episode_id, err.status, err.run_id) == (eid, "COMPLETED", first.first_execution_run_id)
    assert repr(eid) in str(err) and "new id" in str(err)
    answer = error_response(err)
    assert answer.status_code == 409
    assert json.loads(answer.body)["error"]["code"] == "EpisodeIdReusedError"
