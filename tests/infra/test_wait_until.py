"""`wait_until` (infra/worker_process.py) asks again when the server drops a read, and only then.

A loaded dev server answered a `describe_task_queue` of `wait_ready` with CANCELLED ("operation was
canceled") in a loaded suite run, and the test failed at setup although the worker came up. A dropped
read is an answer not given yet; any other error still ends the wait at once.
"""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

from infra.worker_process import WaitTimeoutError, wait_until


def answers(*outcomes):
    """A predicate giving `outcomes` in order (an exception is raised), and the count of calls."""
    calls = []

    async def predicate():
        outcome = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return predicate, calls


@pytest.mark.parametrize(
    "status", [RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE]
)
async def test_a_dropped_read_is_asked_again(status):
    dropped = RPCError("operation was canceled", status, b"")
    predicate, calls = answers(dropped, dropped, None, "ready")
    assert await wait_until(predicate, 60, "the state", every=0) == "ready"
    assert len(calls) == 4


async def test_a_refused_read_ends_the_wait_at_once():
    refused = RPCError("namespace not found", RPCStatusCode.NOT_FOUND, b"")
    predicate, calls = answers(refused, "ready")
    with pytest.raises(RPCError) as info:
        await wait_until(predicate, 60, "the state", every=0)
    assert info.value.status == RPCStatusCode.NOT_FOUND and len(calls) == 1


async def test_reads_dropped_until_the_bound_say_so_in_the_timeout():
    predicate, _ = answers(RPCError("operation was canceled", RPCStatusCode.CANCELLED, b""))
    with pytest.raises(WaitTimeoutError, match="last read dropped by the server: CANCELLED"):
        await wait_until(predicate, 0.05, "the state", every=0.01)
