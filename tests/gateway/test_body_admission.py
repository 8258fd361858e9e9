"""Admission of large chat bodies (gateway/intake/large_bodies.py): per-episode turns in arrival order, a
bounded backlog refused with 429, an overall byte budget, and nothing left held by a request that gave up.

Pure asyncio: every "waits" below is a task observed blocked in the admission's own state (a single event
loop, no threads), never a sleep.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.intake.large_bodies import BodyAdmission, BodyAdmissionLimits, LargeBodyBacklogError

KiB = 1024


class Turn:
    """A request holding (or waiting for) its turn until the test ends it."""

    def __init__(self, admission: BodyAdmission, episode_id: str, size: int) -> None:
        self.entered = asyncio.Event()
        self.leave = asyncio.Event()
        self.task = asyncio.create_task(self._run(admission, episode_id, size))

    async def _run(self, admission: BodyAdmission, episode_id: str, size: int) -> None:
        async with admission.turn(episode_id, size):
            self.entered.set()
            await self.leave.wait()

    async def end(self) -> None:
        self.leave.set()
        await self.task


async def blocked(admission: BodyAdmission, episode_id: str, waiting: int) -> None:
    """Until `waiting` requests of the episode wait for their turn (each blocks in one loop step)."""
    async with asyncio.timeout(5):
        while admission.waiting(episode_id) != waiting:
            await asyncio.sleep(0)


def test_small_bodies_are_not_admitted_here_and_unknown_sizes_are():
    admission = BodyAdmission(BodyAdmissionLimits(large_from=64 * KiB))
    assert not admission.is_large(64 * KiB - 1)
    assert admission.is_large(64 * KiB) and admission.is_large(None)  # chunked: counted as large


async def test_one_large_body_per_episode_at_a_time_in_arrival_order_other_episodes_go_on():
    admission = BodyAdmission(BodyAdmissionLimits(per_episode=1, max_waiting=4))
    first = Turn(admission, "a", 4 * KiB)
    await first.entered.wait()
    second, third = Turn(admission, "a", 4 * KiB), None
    await blocked(admission, "a", 1)
    third = Turn(admission, "a", 4 * KiB)
    await blocked(admission, "a", 2)
    other = Turn(admission, "b", 4 * KiB)
    await other.entered.wait()  # episode b is not behind a's turns
    assert not second.entered.is_set() and not third.entered.is_set()
    await first.end()
    await second.entered.wait()
    assert not third.entered.is_set()
    await second.end()
    await third.end()
    await other.end()
    assert admission.in_progress == 0 and admission.waiting("a") == 0


async def test_past_the_backlog_a_body_is_refused_at_once_with_429_naming_episode_and_bound():
    admission = BodyAdmission(BodyAdmissionLimits(per_episode=1, max_waiting=1, retry_after=3))
    held = Turn(admission, "ep-a", 4 * KiB)
    await held.entered.wait()
    waiting = Turn(admission, "ep-a", 4 * KiB)
    await blocked(admission, "ep-a", 1)
    with pytest.raises(LargeBodyBacklogError) as refused:
        async with admission.turn("ep-a", 5000):
            pytest.fail("admitted past the backlog")
    message = str(refused.value)
    assert refused.value.retry_after == 3
    assert "'ep-a'" in message and "max_waiting = 1" in message and "5000 bytes were not read" in message
    assert "Retry in 3 s" in message
    async with admission.turn("ep-b", 4 * KiB):  # another episode's backlog is its own
        pass
    await held.end()
    await waiting.end()


async def test_the_byte_budget_holds_bodies_of_all_episodes_and_one_body_alone_always_passes():
    admission = BodyAdmission(BodyAdmissionLimits(max_bytes_in_progress=10 * KiB))
    big = Turn(admission, "a", 30 * KiB)  # over the budget alone: admitted, nothing else in progress
    await big.entered.wait()
    assert admission.in_progress == 30 * KiB
    small = Turn(admission, "b", 1 * KiB)
    following = Turn(admission, "c", 1 * KiB)
    async with asyncio.timeout(5):
        while admission.waiting_for_budget != 2:
            await asyncio.sleep(0)
    assert not small.entered.is_set() and not following.entered.is_set()
    await big.end()
    await small.entered.wait()
    await following.entered.wait()  # both fit together once the big one is done
    assert admission.in_progress == 2 * KiB
    await small.end()
    await following.end()
    assert admission.in_progress == 0


async def test_a_request_that_gives_up_while_waiting_leaves_nothing_held():
    admission = BodyAdmission(
        BodyAdmissionLimits(per_episode=1, max_waiting=1, max_bytes_in_progress=4 * KiB)
    )
    held = Turn(admission, "a", 4 * KiB)
    await held.entered.wait()
    turn_waiter = Turn(admission, "a", 4 * KiB)
    await blocked(admission, "a", 1)
    budget_waiter = Turn(admission, "b", 4 * KiB)
    async with asyncio.timeout(5):
        while not admission.waiting_for_budget:
            await asyncio.sleep(0)
    for gone in (turn_waiter, budget_waiter):
        gone.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone.task
    assert admission.waiting("a") == 0 and not admission.waiting_for_budget
    await held.end()
    assert admission.in_progress == 0 and not admission._episodes  # no per-episode state is kept
    async with admission.turn("a", 4 * KiB):  # the turn and the budget are free again
        assert admission.in_progress == 4 * KiB
