"""Held-out tool-calling figures of a model on OpenCode's real requests (models/tool_drills.py).

    python -m models.tool_eval tiny-tools [--trials 48] [--json out.json]

Three request kinds, each taken from the captured opencode-ai 1.18.33 traffic with only the words
replaced by held-out made-up words (`tool_drills.is_held_out`: never in any drill):

- lead: the restricted primary agent's first request (system prompt with OpenCode's environment block,
  only the `task` tool, user `"Words: w1 w2"`). `well_formed`: the reply parses as hermes tool calls
  (chat/toolcalls.py, the gateway's own parser), each naming an offered tool with every required
  argument a string; `two_task_calls`: exactly two `task` calls to `worker`; `word_copied`: per word,
  some call's `prompt` contains it as a word; `both_copied`: per trial, both words.
- worker: a subagent's first request ("Reply with the word w."); `exact`: the reply is the word
  (a final period allowed).
- resume: the lead's request after both task results came back; `both_words`: the reply has both.

Each kind runs greedy and at temperature 0.7 (top_k 0, top_p 1, seeded), with HF `generate`.

Simulated `opencode-delegation` episodes on the same requests, scored by the family's reward, are
harnesses/opencode_delegation_sim.py (the reward belongs to the family, above the models).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from chat.toolcalls import parse_tool_calls
from models.tokenizer import END_OF_TEXT, IM_END
from models.tool_drills import draw_words, harness_requests

MAX_NEW_TOKENS = {"lead": 160, "worker": 16, "resume": 32}


class KindScores(BaseModel):
    trials: int
    scores: dict[str, float]  # metric -> fraction
    example: str  # the first trial's reply


class ToolEvalReport(BaseModel):
    model: str
    trials: int
    seconds: float
    prompt_tokens: dict[str, int]  # each captured OpenCode request, rendered with the model's template
    greedy: dict[str, KindScores]
    t07: dict[str, KindScores]


def _words_of(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def lead_request(words: list[str]) -> dict[str, Any]:
    body = json.loads(json.dumps(harness_requests()["lead_first"]))
    body["messages"][1]["content"] = '"Words: ' + " ".join(words) + '"'
    return body


def worker_request(word: str) -> dict[str, Any]:
    body = json.loads(json.dumps(harness_requests()["worker_first"]))
    body["messages"][1]["content"] = f"Reply with the word {word}."
    return body


def resume_request(words: list[str]) -> dict[str, Any]:
    """The captured resumption with the two captured words (and the workers' answers) replaced."""
    text = json.dumps(harness_requests()["lead_resume"])
    text = text.replace("zorblat", words[0]).replace("quintessa", words[1])
    body = json.loads(text)
    for message, word in zip(body["messages"][3:5], words, strict=True):
        message["content"] = re.sub(
            r"<task_result>\n.*?\n</task_result>",
            f"<task_result>\n{word}\n</task_result>",
            message["content"],
            flags=re.S,
        )
    return body


def score_lead(reply: str, body: dict[str, Any], words: list[str]) -> dict[str, float]:
    parsed = parse_tool_calls(reply)
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in body.get("tools") or []}
    calls = []
    well_formed = parsed.malformed is None and bool(parsed.tool_calls)
    for call in parsed.tool_calls:
        fn = call["function"]
        args = json.loads(fn["arguments"])
        calls.append((fn["name"], args))
        schema = offered.get(fn["name"])
        if schema is None or not all(isinstance(args.get(p), str) for p in schema.get("required", [])):
            well_formed = False
    tasks = [a for name, a in calls if name == "task"]
    copied = [any(w in _words_of(str(a.get("prompt", ""))) for a in tasks) for w in words]
    return {
        "well_formed": float(well_formed),
        "two_task_calls": float(
            well_formed and len(tasks) == 2 and all(a.get("subagent_type") == "worker" for a in tasks)
        ),
        "word_copied": sum(copied) / len(words),
        "both_copied": float(all(copied)),
    }


def score_worker(reply: str, word: str) -> dict[str, float]:
    return {"exact": float(reply.strip().rstrip(".").strip() == word)}


def score_resume(reply: str, words: list[str]) -> dict[str, float]:
    got = _words_of(reply)
    return {"both_words": float(all(w in got for w in words))}


class Generator:
    """A model answering chat requests with HF `generate` (greedy at temperature 0, else seeded sampling)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.stop = [self.tok.convert_tokens_to_ids(IM_END), self.tok.convert_tokens_to_ids(END_OF_TEXT)]

    def reply(self, body: dict[str, Any], *, temperature: float, seed: int, max_new_tokens: int) -> str:
        text = self.tok.apply_chat_template(
            body["messages"], tools=body.get("tools"), add_generation_prompt=True, tokenize=False
        )
        ids = torch.tensor([self.tok(text, add_special_tokens=False)["input_ids"]])
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature
            else {"do_sample": False}
        )
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.stop,
                pad_token_id=self.stop[1],
                **sampling,
            )
        new = out[0, ids.shape[1] :].tolist()
        if new and new[-1] in self.stop:
            new = new[:-1]
        text = self.tok.decode(new, skip_special_tokens=False)
        if not isinstance(text, str):  # decode of one sequence of ids is its text
            raise TypeError(f"the tokenizer decoded one sequence of ids into {type(text).__name__}, not text")
        return text


def prompt_sizes(tokenizer: Any) -> dict[str, int]:
    """Tokens of each captured OpenCode request (generation prompt included) in `tokenizer`."""
    sizes = {}
    for name, body in harness_requests().items():
        text = tokenizer.apply_chat_template(
            body["messages"], tools=body.get("tools"), add_generation_prompt=True, tokenize=False
        )
        sizes[name] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return sizes


def _trial(kind: str, words: list[str]) -> tuple[dict[str, Any], Any]:
    """The request of one trial and the function scoring its reply."""
    if kind == "lead":
        body = lead_request(words)
        return body, lambda reply: score_lead(reply, body, words)
    if kind == "worker":
        return worker_request(words[0]), lambda reply: score_worker(reply, words[0])
    return resume_request(words), lambda reply: score_resume(reply, words)


def _run_kind(
    gen: Generator, kind: str, word_sets: list[list[str]], *, temperature: float, seed: int
) -> KindScores:
    totals: dict[str, float] = {}
    example = ""
    for i, words in enumerate(word_sets):
        body, score = _trial(kind, words)
        reply = gen.reply(body, temperature=temperature, seed=seed + i, max_new_tokens=MAX_NEW_TOKENS[kind])
        for k, v in score(reply).items():
            totals[k] = totals.get(k, 0.0) + v
        example = example or reply
    n = len(word_sets)
    return KindScores(trials=n, scores={k: v / n for k, v in totals.items()}, example=example)


def evaluate(model: str, *, trials: int = 48, seed: int = 1234) -> ToolEvalReport:
    """Run every kind `trials` times greedy and at T=0.7 on held-out words."""
    from models.registry import ensure_model

    t0 = time.perf_counter()
    gen = Generator(ensure_model(model))
    rng = random.Random(seed)
    word_sets = [draw_words(rng, 2, held_out=True) for _ in range(trials)]
    out: dict[str, dict[str, KindScores]] = {}
    for label, temperature in (("greedy", 0.0), ("t07", 0.7)):
        out[label] = {
            kind: _run_kind(gen, kind, word_sets, temperature=temperature, seed=seed)
            for kind in ("lead", "worker", "resume")
        }
    return ToolEvalReport(
        model=str(model),
        trials=trials,
        seconds=time.perf_counter() - t0,
        prompt_tokens=prompt_sizes(gen.tok),
        **out,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model name (tiny-tools) or folder")
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = evaluate(args.model, trials=args.trials)
    for label in ("greedy", "t07"):
        for kind, ks in getattr(report, label).items():
            print(
                f"{label:6s} {kind:6s} "
                + "  ".join(f"{k}={v:.3f}" for k, v in ks.scores.items())
                + f"   e.g. {ks.example[:100]!r}"
            )
    print(f"{report.trials} trials per kind, {report.seconds:.0f} s")
    print("OpenCode prompt tokens: " + ", ".join(f"{k} {v}" for k, v in report.prompt_tokens.items()))
    if args.json:
        args.json.write_text(report.model_dump_json(indent=2))


if __name__ == "__main__":
    main()
