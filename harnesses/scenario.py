"""Controlled episodes for acceptance tests: every structure the reconstruction must get right.

`scenario` — a parent; two workers whose calls overlap in time; worker-1 compacts its context
mid-way and so finishes after worker-2 (completion in reverse spawn order); the parent resumes after
both answers arrive as tool results.

`single-compaction` — one agent, two calls, a compaction (summary call + declared rewrite), two
more calls: the plain context-compaction case (two rows).

`group-outcomes` — what happens to a GRPO group whose episodes end differently, by index in group:
0 makes only an auxiliary call (a title: a valid episode with zero rows), 3 breaks a harness rule
(spawns a worker before any call: a policy failure), every other index makes one action call.

`long-conversation` — one agent, `turns` calls in one context (task param, default LONG_TURNS), a user
turn before each after the first: a native conversation that grows with every call.

The reward is a deterministic pseudo-random function of the texts (a hash mapped to [0, 1)), so the
episodes of a group have distinct rewards without any model skill and GRPO has a signal to test.
"""

from __future__ import annotations

import asyncio
import hashlib

from grove.contracts import HarnessOutcome, RewardResult, TaskSpec
from grove.receipts import CallKind
from harnesses.native import NativeEpisode, system, tool_result, user

NAME = "scenario"
SINGLE_NAME = "single-compaction"
OUTCOMES_NAME = "group-outcomes"
LONG_NAME = "long-conversation"
LONG_TURNS = 16
AUX_ONLY_INDEX = 0
POLICY_FAILURE_INDEX = 3


def make_task(index: int) -> TaskSpec:
    return TaskSpec(family=NAME, task_id=f"{NAME}-{index}", params={"topic": f"topic {index}"})


async def program(episode: NativeEpisode) -> str:
    topic = episode.spec.task.params.get("topic", "the task")
    parent = await episode.root("parent", [system("You are the lead."), user(f"Plan work on {topic}.")])
    await parent.reply()
    worker_msgs = [system("You are a worker."), user(f"Work on {topic}.")]
    w1 = await episode.spawn("worker-1", by=parent, messages=worker_msgs)
    w2 = await episode.spawn("worker-2", by=parent, messages=worker_msgs)

    async def long_worker():  # two turns, compaction, final turn: finishes after worker-2
        await w1.reply()
        await w1.reply(user("Continue."))
        await w1.compact("Summarize your work so far.")
        return await w1.reply(user("Give your final answer."))

    answers = await asyncio.gather(long_worker(), w2.reply())
    final = await parent.reply(*(tool_result(a.text) for a in answers))
    return final.text


async def single_agent_program(episode: NativeEpisode) -> str:
    topic = episode.spec.task.params.get("topic", "the task")
    agent = await episode.root("parent", [system("You are an agent."), user(f"Work on {topic}.")])
    await agent.reply()
    await agent.reply(user("Continue."))
    await agent.compact("Summarize your work so far.")
    await agent.reply(user("Continue."))
    final = await agent.reply(user("Give your final answer."))
    return final.text


async def group_outcomes_program(episode: NativeEpisode) -> str:
    j = episode.spec.index_in_group
    agent = await episode.root("parent", [system("You are an agent."), user("Answer briefly.")])
    if j == AUX_ONLY_INDEX:
        title = await agent.reply(user("Give this conversation a title."), kind=CallKind.TITLE)
        return title.text
    if j == POLICY_FAILURE_INDEX:
        await episode.spawn("worker-1", by=agent, messages=[user("Help.")])  # NativeHarnessError
    return (await agent.reply()).text


async def long_conversation_program(episode: NativeEpisode) -> str:
    turns = int(episode.spec.task.params.get("turns", LONG_TURNS))
    agent = await episode.root("parent", [system("You are an agent."), user("Count with me.")])
    reply = await agent.reply()
    for k in range(1, turns):
        reply = await agent.reply(user(f"Turn {k}: go on."))
    return reply.text


def score(task: TaskSpec, outcome: HarnessOutcome) -> RewardResult:
    texts = [outcome.final_answer] + [f"{a}:{t}" for a, ts in sorted(outcome.outputs.items()) for t in ts]
    digest = hashlib.sha256("\x00".join(texts).encode()).digest()
    return RewardResult(reward=int.from_bytes(digest[:4], "big") / 2**32)
