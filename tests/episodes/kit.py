"""Helpers of the episode durability tests: external episodes driven through the gateway's `Episodes`
(the Temporal Updates an external harness's requests become), with token-id prompts so each call is one
short generation on the real tiny vLLM engine.

Shape of a driven episode: context `parent` has a root call `parent.c0` (prompt PROMPT); every later
call `parent.c{i}` branches from the root with a two-token suffix, so prompts stay short however many
calls an episode takes, and every call is an endpoint (one row per branch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from gateway.temporal.episode_client import HANDING_OVER, Episodes
from grove import queues
from grove.contracts import CallRequest, CallResult, EpisodeSpec, HarnessSpec, PromptSpec
from grove.receipts import ContextOrigin, ContextRecord
from grove.sampling import SamplingConfig
from grove.store_layout import staging_key
from harnesses import scenario

PROMPT = [11, 12, 13, 14, 15, 16]
ROOT = ContextRecord(context_id="parent", agent="parent", origin=ContextOrigin.ROOT)


def episode_spec(name: str, **fields) -> EpisodeSpec:
    run = f"ep-{name}-{uuid.uuid4().hex[:6]}"
    return EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g0",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=1), **fields,
    )  # fmt: skip


async def start(client: Client, spec: EpisodeSpec) -> str:
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


def call_request(episode_id: str, i: int) -> CallRequest:
    """Call i of context `parent`: the root (i=0) or a branch from it with suffix [20 + i % 50, 7]."""
    if i == 0:
        return CallRequest(call_id="parent.c0", context_id="parent", prompt=PromptSpec(ids=PROMPT))
    prompt = PromptSpec(
        suffix_ids=[20 + i % 50, 7],
        parent_call_id="parent.c0",
        parent_staging_key=staging_key(episode_id, "parent.c0"),
    )
    return CallRequest(
        call_id=f"parent.c{i}", context_id="parent", extends="parent.c0", branch=True, prompt=prompt
    )


async def open_and_call(episodes: Episodes, episode_id: str, n: int) -> list[CallResult]:
    """Open the parent context and make calls 0..n-1 one after another."""
    await episodes.open_context(episode_id, ROOT)
    return [await episodes.call(episode_id, call_request(episode_id, i)) for i in range(n)]


async def branching_calls(episodes: Episodes, episode_id: str, n: int, at_once: int) -> list[CallResult]:
    """Open the parent context, make its root call c0, then calls 1..n-1 (each a branch from c0),
    `at_once` in flight at a time; the results of calls 1..n-1."""
    await episodes.open_context(episode_id, ROOT)
    await episodes.call(episode_id, call_request(episode_id, 0))
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> CallResult:
        async with gate:
            return await episodes.call(episode_id, call_request(episode_id, i))

    return await asyncio.gather(*(one(i) for i in range(1, n)))


def first_id(call_id: str) -> str:
    """The call's own id without a retry's `.r<k>` (`parent.c529.r1` -> `parent.c529`)."""
    head, _, tail = call_id.rpartition(".")
    return head if head and tail.startswith("r") and tail[1:].isdigit() else call_id


def each_call_once(results: list[CallResult], n: int) -> list[str]:
    """Check that branching calls 1..n-1 each completed exactly once and return the lost attempts.

    An attempt lost to a timeout (a heavily loaded machine: seen once at 2,400 calls beside two test
    suites) is discarded and re-run as `<id>.r<k>` by the lost-attempt rule, so a call completes under
    its own id or a retry's; every lost attempt belongs to a call that completed under a retry's id."""
    completed = [r.call_id for r in results]
    lost = [a for r in results for a in r.lost_attempts]
    assert sorted(first_id(c) for c in completed) == sorted(f"parent.c{i}" for i in range(1, n))
    assert {first_id(a) for a in lost} <= {first_id(c) for c in completed if c != first_id(c)}
    return lost


class CountingEpisodes(Episodes):
    """The gateway's Episodes, counting the HandingOver refusals it retried (what a harness never saw)."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.handover_retries = 0

    async def _through_handover(self, episode_id, what, update):
        async def counted():
            try:
                return await update()
            except WorkflowUpdateFailedError as err:
                if isinstance(err.cause, ApplicationError) and err.cause.type == HANDING_OVER:
                    self.handover_retries += 1
                raise

        return await super()._through_handover(episode_id, what, counted)


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """`folder` refuses new entries until the block ends: chattr +i as root (root ignores modes), else
    chmod 0555. A storage outage of the local store that the test switches off itself."""
    folder.mkdir(parents=True, exist_ok=True)
    as_root = os.geteuid() == 0
    if as_root:
        subprocess.run([shutil.which("chattr") or "chattr", "+i", str(folder)], check=True)
    else:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
    try:
        yield
    finally:
        if as_root:
            subprocess.run([shutil.which("chattr") or "chattr", "-i", str(folder)], check=True)
        else:
            folder.chmod(mode)
