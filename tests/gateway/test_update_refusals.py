"""Updates refused without being admitted are sent again; refusals that answer the request are not.

Temporal's server rejects an Update as `UnprocessedUpdate` (ApplicationFailure, source Server,
non-retryable) when a worker completes the workflow task that carried it without processing it. A loaded
demo run met it once in 640 episodes (the worker's log: "There are unprocessed protocol messages while
receiving new work"); the gateway answered 400 and the harness program died with the episode. It cannot be
produced on demand (a race inside the SDK core), so these tests raise it exactly as the Temporal client
raises it, and drive the gateway's own retry path.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from gateway.temporal.episode_client import Episodes, EpisodeUpdateRejectedError

SERVER_MESSAGE = (
    "Workflow Update is rejected because it wasn't processed by worker. Probably, Workflow Update is not "
    "supported by the worker."
)


def refusal(message: str, kind: str) -> WorkflowUpdateFailedError:
    return WorkflowUpdateFailedError(ApplicationError(message, type=kind, non_retryable=True))


async def test_an_unprocessed_update_is_sent_again_and_its_answer_returned():
    attempts: list[int] = []

    async def update() -> str:
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise refusal(SERVER_MESSAGE, "UnprocessedUpdate")
        return "admitted"

    assert await Episodes(client=None)._through_handover("ep-1", "call parent.0.c1", update) == "admitted"
    assert len(attempts) == 3


async def test_a_refusal_of_the_ledger_reaches_the_caller_at_once():
    attempts: list[int] = []

    async def update() -> str:
        attempts.append(len(attempts))
        raise refusal("call parent.0.c0 is stale", "StaleContinuationError")

    with pytest.raises(EpisodeUpdateRejectedError) as err:
        await Episodes(client=None)._through_handover("ep-1", "call parent.0.c1", update)
    assert err.value.error_type == "StaleContinuationError" and len(attempts) == 1
