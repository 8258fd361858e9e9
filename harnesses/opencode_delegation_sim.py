"""Simulated `opencode-delegation` episodes of a model, scored by the family's reward.

    python -m harnesses.opencode_delegation_sim tiny-copy [--tasks 6] [--group 4] [--temperature 0.7]

Each episode plays the family's requests (models/tool_eval.py: OpenCode's captured request text with
held-out words) chained the way OpenCode chains them: the lead's first reply is parsed with the
gateway's parser; each `task` call to `worker` becomes a worker request whose user message is the
call's `prompt`; the workers' replies come back in OpenCode's `<task ...><task_result>` wrapper in the
lead's resumption (arguments re-serialised as compact JSON); the family's reward function scores the
outcome. It is a simulation of the binary on its captured request text (no OpenCode, no gateway, no
vLLM): calls to other agents get no answer, and a lead reply without tool calls is its final answer.
It lives beside the family (not in models/) because the reward is the family's.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import torch
from pydantic import BaseModel

from chat.toolcalls import parse_tool_calls
from grove.contracts import HarnessOutcome, TaskSpec
from harnesses.opencode_delegation import FAMILY, score
from models.tool_drills import draw_words
from models.tool_eval import Generator, lead_request, worker_request

MAX_EPISODE_TOKENS = 128  # each call's max_tokens in a simulated episode (OpenCode's limit.output)


def _task_result(index: int, answer: str) -> str:
    session = f"ses_{index:012x}simulatedXXXXXX"
    return f'<task id="{session}" state="completed">\n<task_result>\n{answer}\n</task_result>\n</task>'


def play_episode(gen: Generator, words: list[str], *, temperature: float, seed: int) -> HarnessOutcome:
    """One simulated `opencode-delegation` episode on OpenCode's captured request text (module doc)."""
    limit = MAX_EPISODE_TOKENS
    first = lead_request(words)
    reply = gen.reply(first, temperature=temperature, seed=seed, max_new_tokens=limit)
    parsed = parse_tool_calls(reply)
    outputs: dict[str, list[str]] = {"lead": [reply]}
    if not parsed.tool_calls:
        return HarnessOutcome(final_answer=reply, outputs=outputs)
    calls, results = [], []
    for i, call in enumerate(parsed.tool_calls):
        args = json.loads(call["function"]["arguments"])
        compact = json.dumps(args, separators=(",", ":"), ensure_ascii=False)  # as OpenCode re-sends it
        calls.append({**call, "function": {**call["function"], "arguments": compact}})
        answer = ""
        if call["function"]["name"] == "task" and args.get("subagent_type") == "worker":
            body = worker_request("x")
            body["messages"][1]["content"] = str(args.get("prompt", ""))
            answer = gen.reply(body, temperature=temperature, seed=seed + 1 + i, max_new_tokens=limit)
            outputs[f"worker-{len(outputs)}"] = [answer]
        results.append({"role": "tool", "tool_call_id": call["id"], "content": _task_result(i, answer)})
    resume = json.loads(json.dumps(first))
    resume["messages"] += [{"role": "assistant", "content": parsed.content or "", "tool_calls": calls}]
    resume["messages"] += results
    final = gen.reply(resume, temperature=temperature, seed=seed + 100, max_new_tokens=limit)
    outputs["lead"].append(final)
    return HarnessOutcome(final_answer=parse_tool_calls(final).content or "", outputs=outputs)


class EpisodeScores(BaseModel):
    """Rewards of simulated episodes: per task, its group's rewards."""

    temperature: float
    groups: list[list[float]]
    mean: float
    groups_with_spread: float  # share of groups whose rewards are not all equal (a GRPO signal)
    workers: float  # mean of the reward's worker part
    parent: float  # mean of the reward's parent part
    example: dict[str, Any]


def play_episodes(
    model: str, *, tasks: int, group: int, temperature: float = 0.7, seed: int = 0
) -> EpisodeScores:
    """`tasks` held-out tasks of the family (the family's own word draw, on the held-out side), `group`
    samples each."""
    from models.registry import ensure_model

    gen = Generator(ensure_model(model))
    rng = random.Random(seed)
    groups, workers, parent, example = [], [], [], {}
    for t in range(tasks):
        words = draw_words(rng, 2, held_out=True, common_share=0.0)
        task = TaskSpec(family=FAMILY, task_id=f"eval-{t}", params={"words": words})
        rewards = []
        for g in range(group):
            outcome = play_episode(gen, words, temperature=temperature, seed=seed + 1000 * t + 10 * g)
            result = score(task, outcome)
            rewards.append(result.reward)
            workers.append(result.details["workers"])
            parent.append(result.details["parent"])
            example = example or {"words": words, **outcome.model_dump(), "reward": result.reward}
        groups.append(rewards)
    flat = [r for rs in groups for r in rs]
    return EpisodeScores(
        temperature=temperature,
        groups=groups,
        mean=sum(flat) / len(flat),
        groups_with_spread=sum(len(set(rs)) > 1 for rs in groups) / len(groups),
        workers=sum(workers) / len(workers),
        parent=sum(parent) / len(parent),
        example=example,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model name (tiny-copy) or folder")
    parser.add_argument("--tasks", type=int, default=6, help="simulated opencode-delegation tasks")
    parser.add_argument("--group", type=int, default=4, help="samples per simulated task")
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scores = play_episodes(args.model, tasks=args.tasks, group=args.group, temperature=args.temperature)
    print(scores.model_dump_json(indent=1))


if __name__ == "__main__":
    main()
