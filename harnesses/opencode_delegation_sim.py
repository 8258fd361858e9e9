"""Simulated `opencode-delegation` (or `opencode-reader`, `opencode-report`) episodes of a model, scored by
the family's reward.

    python -m harnesses.opencode_delegation_sim tiny-copy [--tasks 6] [--group 4] [--temperature 0.7]
    python -m harnesses.opencode_delegation_sim tiny-reader --family opencode-reader
    python -m harnesses.opencode_delegation_sim tiny-report --family opencode-report

Each episode plays the family's requests (models/tool_eval.py: OpenCode's captured request text with
held-out words) chained the way OpenCode chains them: the lead's first reply is parsed with the
gateway's parser; each `task` call to `worker` becomes a worker request whose user message is the
call's `prompt`; the workers' replies come back in OpenCode's `<task ...><task_result>` wrapper in the
lead's resumption (arguments re-serialised as compact JSON); the family's reward function scores the
outcome. It is a simulation of the binary on its captured request text (no OpenCode, no gateway, no
vLLM): calls to other agents get no answer, and a lead reply without tool calls is its final answer.
It lives beside the family (not in models/) because the reward is the family's.

`opencode-reader` (and `opencode-report`) workers play their four requests (models/reader_drills.py) on
the model's own replies: the first request with the `read` tool; if the reply calls `read`, the result
(the task's notes), the answer, OpenCode's compaction call on that conversation (the summary), and the
rewritten session, whose reply is the worker's answer. A worker that does not call `read` answers at once
and does not compact (its context stays under the line). The real compaction depends on the usage the
gateway reports; the simulation assumes the notes always push a worker that read them over it (they do at
the family's WORKER_CONTEXT).
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
from harnesses import opencode_reader, opencode_report
from harnesses.opencode_delegation import FAMILY
from harnesses.programs import family as task_family
from models import reader_drills
from models.tool_drills import draw_words
from models.tool_eval import Generator, lead_request, worker_request

READER_FAMILIES = (opencode_reader.FAMILY, opencode_report.FAMILY)  # workers that read notes.txt
MAX_EPISODE_TOKENS = 128  # each call's max_tokens in a simulated episode (OpenCode's limit.output)


def _task_result(index: int, answer: str) -> str:
    session = f"ses_{index:012x}simulatedXXXXXX"
    return f'<task id="{session}" state="completed">\n<task_result>\n{answer}\n</task_result>\n</task>'


READER_FOLDER = "/tmp/grove-worker-sim/harness/0123456789abcdef/project"  # the runner's kind of folder


def plain_worker(gen: Generator, prompt: str, notes: str, *, temperature: float, seed: int) -> list[str]:
    """An `opencode-delegation` worker's reply to its one request."""
    body = worker_request("x")
    body["messages"][1]["content"] = prompt
    return [gen.reply(body, temperature=temperature, seed=seed, max_new_tokens=MAX_EPISODE_TOKENS)]


def reader_worker(gen: Generator, prompt: str, notes: str, *, temperature: float, seed: int) -> list[str]:
    """An `opencode-reader` worker's replies (module doc): [first] or [read call, answer, summary,
    answer from the summary]."""
    limit = MAX_EPISODE_TOKENS
    captured = worker_request("x")["messages"][0]["content"]  # the worker's prompt, then OpenCode's env
    system = reader_drills.READER_PROMPT + "\n" + captured.split("\n", 1)[1]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    body = {"messages": messages, "tools": [reader_drills.read_tool()]}
    first = gen.reply(body, temperature=temperature, seed=seed, max_new_tokens=limit)
    parsed = parse_tool_calls(first)
    if not any(c["function"]["name"] == "read" for c in parsed.tool_calls):
        return [first]
    result = reader_drills.read_result(READER_FOLDER, notes)
    turns = reader_drills.worker_turns(system, prompt, result, "")[:4]
    turns[2] = {"role": "assistant", "content": parsed.content or "", "tool_calls": parsed.tool_calls}
    answer = gen.reply(
        {**body, "messages": turns}, temperature=temperature, seed=seed + 1, max_new_tokens=limit
    )
    # OpenCode compacts here: the summary of that conversation, then the session rewritten around it
    summary_body = {"messages": reader_drills.summary_turns(prompt, result, answer)[:2]}
    summary = gen.reply(summary_body, temperature=temperature, seed=seed + 2, max_new_tokens=limit)
    after = reader_drills.after_compaction_turns(system, prompt, "")[:4]
    after[2] = {"role": "assistant", "content": summary}
    final = gen.reply(
        {**body, "messages": after}, temperature=temperature, seed=seed + 3, max_new_tokens=limit
    )
    return [first, answer, summary, final]


def play_episode(
    gen: Generator, words: list[str], *, temperature: float, seed: int, reader: bool = False, notes: str = ""
) -> HarnessOutcome:
    """One simulated `opencode-delegation` episode on OpenCode's captured request text (module doc);
    `reader`: `opencode-reader` workers reading `notes`."""
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
            play = reader_worker if reader else plain_worker
            prompt = str(args.get("prompt", ""))
            replies = play(gen, prompt, notes, temperature=temperature, seed=seed + 1 + i)
            answer = replies[-1]
            n = sum(name.startswith("worker-") for name in outputs) + 1
            outputs[f"worker-{n}"] = [answer]
            outputs[f"trace-{n}"] = replies  # every reply of the worker (scorers read worker-* only)
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
    details: dict[str, float]  # mean of each of the reward's components
    example: dict[str, Any]


def play_episodes(
    model: str, *, tasks: int, group: int, temperature: float = 0.7, seed: int = 0, family: str = FAMILY
) -> EpisodeScores:
    """`tasks` held-out tasks of the family (the family's own word draw, on the held-out side), `group`
    samples each; `family`: opencode-delegation, or opencode-reader / opencode-report (workers that read
    notes of the family's own draw); scored by the family's reward."""
    from models.registry import ensure_model

    gen = Generator(ensure_model(model))
    rng = random.Random(seed)
    score = task_family(family)[1]
    reader = family in READER_FAMILIES
    groups, details = [], []
    example: dict[str, Any] = {}
    for t in range(tasks):
        words = draw_words(rng, 2, held_out=True, common_share=0.0)
        task = TaskSpec(family=family, task_id=f"eval-{t}", params={"words": words})
        notes = opencode_reader.notes(task) if reader else ""
        rewards = []
        for g in range(group):
            outcome = play_episode(
                gen, words, temperature=temperature, seed=seed + 1000 * t + 10 * g, reader=reader, notes=notes
            )
            result = score(task, outcome)
            rewards.append(result.reward)
            details.append(result.details)
            example = example or {"words": words, **outcome.model_dump(), "reward": result.reward}
        groups.append(rewards)
    flat = [r for rs in groups for r in rs]
    means = {k: sum(d[k] for d in details) / len(details) for k in details[0]}
    return EpisodeScores(
        temperature=temperature,
        groups=groups,
        mean=sum(flat) / len(flat),
        groups_with_spread=sum(len(set(rs)) > 1 for rs in groups) / len(groups),
        workers=means["workers"],
        parent=means["parent"],
        details=means,
        example=example,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model name (tiny-copy) or folder")
    parser.add_argument("--tasks", type=int, default=6, help="simulated opencode-delegation tasks")
    parser.add_argument("--group", type=int, default=4, help="samples per simulated task")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--family", choices=(FAMILY, *READER_FAMILIES), default=FAMILY)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scores = play_episodes(
        args.model, tasks=args.tasks, group=args.group, temperature=args.temperature, family=args.family
    )
    print(scores.model_dump_json(indent=1))


if __name__ == "__main__":
    main()
