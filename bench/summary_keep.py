"""How often a model's summary keeps the worker's word in `summary-delegation` episodes, before training:
the start of `grove demo --summaries` (docs/results.md section 1.7) simulated on the CPU with transformers.

    python -m bench.summary_keep tiny-summary [--tasks 16] [--group 8] [--temperature 0.7] [--seed 0]
    python -m bench.summary_keep tiny-summary --calls $GROVE_HOME/store/calls/<run id>   # a run, per step

Each episode is the native program's five calls in order (harnesses/summary_delegation.py: the lead's
delegating turn, each worker's summary, each worker's answer from its summary, the lead's final answer),
the prompts rendered by the model's chat template, each completion sampled at the demo's settings (max 8
tokens) and scored by the family's own `score`. Prints, over the episodes: how often a summary's first
line is its word, its distractor or something else; how often a worker's answer repeats its summary's
first line; the reward and its components; and how many tasks' groups hold both a kept and a lost
summary (GRPO learns only from groups whose episodes differ). With `--calls` (a run's call records in a
file store: `calls/<run>/s<step>/t<task>/g<episode>.json`), prints instead, per step of that run, the share
of its summary calls whose first line is the word / the distractor (the model names the tokenizer).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from statistics import mean

import torch

from grove.contracts import HarnessOutcome
from harnesses import summary_delegation as family
from harnesses.delegation import parent_prompt
from harnesses.delegation_words import PARENT_SYSTEM
from harnesses.native import system, tool_result, user


class Sampler:
    """Samples completions of chats at fixed settings, with a seeded torch generator."""

    def __init__(self, model_name: str, temperature: float, max_tokens: int, seed: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from models.registry import ensure_model

        folder = ensure_model(model_name)
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.temperature, self.max_tokens = temperature, max_tokens
        torch.manual_seed(seed)

    def __call__(self, messages: list[dict]) -> str:
        text = str(self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        ids: torch.Tensor = self.tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=self.temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=self.max_tokens,
            )
        return str(self.tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip().lower() if text.strip() else ""


def episode(sample: Sampler, words: list[str], others: list[str]) -> tuple[HarnessOutcome, list[str]]:
    """The native program's calls in order; returns the outcome and each summary's text."""
    lead = [system(PARENT_SYSTEM), parent_prompt(words)]
    lead.append({"role": "assistant", "content": sample(lead)})
    summaries, answers = [], []
    for word, other in zip(words, others, strict=True):
        base = [system(family.WORKER_SYSTEM), family.worker_prompt(word, other)]
        summary = sample([*base, user(family.SUMMARY_INSTRUCTION)])
        rewritten = [base[0], user(family.SUMMARY_TEMPLATE.format(summary)), user(family.ASK)]
        summaries.append(summary)
        answers.append(sample(rewritten))
    final = sample([*lead, *(tool_result(a) for a in answers)])
    outputs = {f"worker-{i + 1}~summary": [s] for i, s in enumerate(summaries)}
    outputs |= {f"worker-{i + 1}": [a] for i, a in enumerate(answers)}
    return HarnessOutcome(final_answer=final, outputs=outputs), answers


def run_keep_rates(model_name: str, calls: Path) -> None:
    """Per step of a run: the share of its summary calls whose first line is the word / the distractor."""
    from transformers import AutoTokenizer

    from models.registry import ensure_model

    tok = AutoTokenizer.from_pretrained(str(ensure_model(model_name)))
    for step in sorted(calls.glob("s*")):
        kept = lost = n = 0
        for task_dir in step.glob("t*"):
            params = family.make_task(int(task_dir.name[1:])).params
            for episode_file in task_dir.glob("g*.json"):
                for call in json.loads(episode_file.read_text())["calls"]:
                    receipt = call["receipt"]
                    if receipt["kind"] != "summary" or call["completion_ids"] is None:  # a lost attempt
                        continue
                    i = int(receipt["agent"].removeprefix("worker-").split("~")[0]) - 1
                    line = first_line(str(tok.decode(call["completion_ids"], skip_special_tokens=True)))
                    kept += line == params["words"][i]
                    lost += line == params["distractors"][i]
                    n += 1
        print(f"{step.name}: word {kept / n:.2f} distractor {lost / n:.2f} ({n} summaries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=Path, help="a run's call records (calls/<run id> in a file store)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.calls is not None:
        run_keep_rates(args.model, args.calls)
        return
    sample = Sampler(args.model, args.temperature, args.max_tokens, args.seed)
    indices = random.Random(args.seed).sample(range(64), args.tasks)  # the demo's num_tasks
    kept, lost, other, follow, rewards = 0, 0, 0, 0, []
    components: dict[str, list[float]] = {"summary": [], "workers": [], "parent": []}
    mixed = 0
    for index in indices:
        task = family.make_task(index)
        words, others = task.params["words"], task.params["distractors"]
        group_kept = []
        for _ in range(args.group):
            outcome, answers = episode(sample, words, others)
            result = family.score(task, outcome)
            rewards.append(result.reward)
            for key in components:
                components[key].append(result.details[key])
            for i, (word, distractor) in enumerate(zip(words, others, strict=True)):
                line = first_line(outcome.outputs[f"worker-{i + 1}~summary"][0])
                kept += line == word
                lost += line == distractor
                other += line not in (word, distractor)
                follow += first_line(answers[i]) == line
                group_kept.append(line == word)
        mixed += any(group_kept) and not all(group_kept)
    n = len(rewards) * 2
    print(
        f"model {args.model}: {len(rewards)} episodes ({args.tasks} tasks x {args.group}), "
        f"T {args.temperature}"
    )
    print(f"summaries: word {kept / n:.3f}, distractor {lost / n:.3f}, other {other / n:.3f} (of {n})")
    print(f"answers repeating their summary's first line: {follow / n:.3f}")
    print(f"reward {mean(rewards):.3f}; " + ", ".join(f"{k} {mean(v):.3f}" for k, v in components.items()))
    print(f"groups with kept and lost summaries: {mixed} of {args.tasks}")


if __name__ == "__main__":
    main()
