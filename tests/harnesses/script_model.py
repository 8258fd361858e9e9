"""A real policy that plays one scripted OpenCode episode: `tiny-tools` fine-tuned until its replies to the
requests stock OpenCode sends in the acceptance episode (tests/e2e/test_opencode_acceptance.py) are
fixed texts, whatever the environment block (working directory, date, model name), the task's words and
the session ids. vLLM serves it like any model; its replies are genuinely sampled tokens with the
engine's logprobs, not made-up responses (the way tests/harnesses/eos_model.py makes empty replies).

Why: no local model delegates on its own reliably (docs/results.md section 2.2), and the acceptance
test must exercise two concurrent subagents and a compaction every time. The script:

- the lead's first request (the `task` tool offered) -> two `task` calls, "Say red" and "Say cat";
- the worker asked "Say red" -> " red" repeated with no end: it always fills `max_tokens`, so its usage
  is its prompt + max_tokens (the test sets the workers' `limit.context` under it: OpenCode compacts
  that session);
- the worker asked "Say cat" -> "cat" (a short usage: no compaction);
- OpenCode's summarization request -> "Said red.";
- the post-compaction request ("What did we do so far?" ...) -> "red";
- the lead's resumption with both task results -> "red cat".

Built once per machine into the model cache (models/registry.py's locking and atomic publish) and
checked right after training: greedy replies to fresh held-out variants must be the script's.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.corpus import render_chat
from models.manifest import write_manifest
from models.registry import _ensure_cached, ensure_model, models_cache_dir
from models.tool_drills import (
    _DAYS,
    _MONTHS,
    LEAD_PROMPT,
    WORKER_PROMPT,
    ToolDrillWriter,
    _compaction_turns,
    _env_template,
    _summary_texts,
    task_tool,
)
from tests.harnesses.scripted_tune import Example, fine_tune

VERSION = "script-2"
BASE = "tiny-tools"
WORDS = ("red", "cat")  # one token each in tiny-tools' tokenizer, with or without a leading space
SUMMARY = "Said red."
REPEAT = 160  # training length of the endless reply (tokens of " red"); max_tokens stays below it
STEPS, LR, VARIANTS = 160, 3e-3, 32
WORKER_DESCRIPTION = "Repeats the word it is given."  # harnesses/opencode_delegation.py OPENCODE_AGENTS


class ScriptModelError(RuntimeError):
    """The fine-tuned model does not reply with its script on held-out variants."""


def ask(word: str) -> str:
    return f"Say {word}"


def lead_calls() -> dict[str, Any]:
    calls = [
        {
            "type": "function",
            "function": {
                "name": "task",
                "arguments": {"description": ask(w), "prompt": ask(w), "subagent_type": "worker"},
            },
        }
        for w in WORDS
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


class _Variants:
    """The episode's requests with everything OpenCode or the task varies drawn from one seeded stream."""

    def __init__(self, seed: int) -> None:
        self.w = ToolDrillWriter(seed)
        self.rng = self.w.rng

    def _folder(self) -> str:
        """Working directories as the runner makes them (a temporary root, the episode folder's 16 hex
        digits: many tokens each) and plain word paths. Only word paths in training made the model end
        its turn after the first `task` call under a real runner path."""
        rng, w = self.rng, self.w
        digits = "".join(rng.choice("0123456789abcdef") for _ in range(16))
        return rng.choice(
            (
                f"/tmp/pytest-of-{w.name()}/pytest-{rng.randint(0, 9999)}/{w.name()}{rng.randint(0, 9)}/"
                f"harness/{digits}/project",
                f"/{w.name()}/{w.name()}/harness/{digits}/project",
                f"/tmp/{w.name()}-{digits[: rng.randint(4, 12)]}/project",
                "/" + "/".join(w.name() for _ in range(rng.randint(1, 4))),
            )
        )

    def _system(self, prompt: str) -> dict[str, str]:
        rng, folder = self.rng, self._folder()
        date = f"{rng.choice(_DAYS)} {rng.choice(_MONTHS)} {rng.randint(1, 28):02d} {rng.randint(2024, 2030)}"
        model = rng.choice(("grove", "policy", self.w.name()))
        env = _env_template().format(dir=folder, provider="grove", model=model, date=date)
        if rng.random() < 0.7:  # outside a git repository (the runner's folders): root "/", "no"
            env = env.replace(f"Workspace root folder: {folder}", "Workspace root folder: /")
            env = env.replace("git repo: yes", "git repo: no")
        return {"role": "system", "content": prompt + env}

    def _tools(self) -> list[dict[str, Any]]:
        return [task_tool([("worker", WORKER_DESCRIPTION)], "long")]

    def _user(self) -> dict[str, str]:
        words = " ".join(self.w.words(2))
        return {"role": "user", "content": self.rng.choice((f'"Words: {words}"', f"Words: {words}"))}

    def lead_first(self) -> tuple[list[dict], list[dict] | None]:
        return [self._system(LEAD_PROMPT), self._user()], self._tools()

    def lead_resume(self) -> tuple[list[dict], list[dict] | None]:
        messages = [self._system(LEAD_PROMPT), self._user(), lead_calls()]
        messages += [self.w.task_result(w) for w in WORDS]
        return messages, self._tools()

    def worker(self, word: str) -> tuple[list[dict], list[dict] | None]:
        return [self._system(WORKER_PROMPT), {"role": "user", "content": ask(word)}], None

    def summary(self) -> tuple[list[dict], list[dict] | None]:
        system, before, after = _summary_texts()
        reply = " ".join([WORDS[0]] * self.rng.randint(20, 120))
        conversation = f"[User]: {ask(WORDS[0])}\n\n[Assistant]: {reply}\n"
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": before + conversation + after},
        ], None

    def after_compaction(self) -> tuple[list[dict], list[dict] | None]:
        question, cont = _compaction_turns()
        messages = [
            self._system(WORKER_PROMPT),
            {"role": "user", "content": question},
            {"role": "assistant", "content": SUMMARY},
            {"role": "user", "content": cont},
        ]
        return messages, None


def script(v: _Variants) -> list[tuple[list[dict], list[dict] | None, Any]]:
    """(messages, tools, reply) of every request of the episode; reply None: the endless repetition."""
    return [
        (*v.lead_first(), lead_calls()),
        (*v.worker(WORDS[0]), None),
        (*v.worker(WORDS[1]), {"role": "assistant", "content": WORDS[1]}),
        (*v.summary(), {"role": "assistant", "content": SUMMARY}),
        (*v.after_compaction(), {"role": "assistant", "content": WORDS[0]}),
        (*v.lead_resume(), {"role": "assistant", "content": " ".join(WORDS)}),
    ]


def _example(tok: Any, messages: list[dict], tools: list[dict] | None, reply: Any) -> tuple[list[int], int]:
    """Token ids of prompt + reply and where the reply starts (the loss covers the reply only)."""
    prompt = render_chat(messages, tools) + "<|im_start|>assistant\n"
    if reply is None:
        full = prompt + f" {WORDS[0]}" * REPEAT
    else:
        full = render_chat([*messages, reply], tools)
        if not full.startswith(prompt):
            raise ScriptModelError("the chat template does not render the reply after the generation prompt")
        full = full[: full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")]  # the turn ends there
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    return tok(full, add_special_tokens=False)["input_ids"], n_prompt


def fingerprint(base_dir: Path) -> str:
    h = hashlib.sha256(VERSION.encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    h.update(json.dumps([WORDS, SUMMARY, REPEAT, STEPS, LR, VARIANTS]).encode())
    return h.hexdigest()[:16]


def build(out: Path, base_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    examples = [_example(tok, *r) for seed in range(VARIANTS) for r in script(_Variants(seed))]
    kinds = len(examples) // VARIANTS

    def next_batch(rng: random.Random) -> list[Example]:  # one variant of each request kind
        return [examples[rng.randrange(VARIANTS) * kinds + k] for k in range(kinds)]

    loss = fine_tune(base_dir, out, next_batch, steps=STEPS, lr=LR, label="script model")
    check(out)
    write_manifest(out, {"fingerprint": fingerprint(base_dir), "base": str(base_dir), "final_loss": loss})


def check(model_dir: Path, seeds: range = range(1000, 1004), max_new: int = 160) -> None:
    """Greedy replies to held-out variants must be the script (the endless reply: `max_new` tokens of it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for seed in seeds:
        for messages, tools, reply in script(_Variants(seed)):
            full, n_prompt = _example(tok, messages, tools, reply)
            want = full[n_prompt:][:max_new]
            prompt = torch.tensor([full[:n_prompt]])
            with torch.no_grad():
                out = model.generate(
                    prompt, max_new_tokens=len(want), do_sample=False, eos_token_id=None, pad_token_id=0
                )
            got = out[0, n_prompt:].tolist()
            if got != want:
                raise ScriptModelError(
                    f"script model {model_dir}: held-out variant {seed} replied {tok.decode(got)!r} to "
                    f"{messages[-1]['content'][:60]!r}, not {tok.decode(want)!r}"
                )


def ensure_script_model() -> Path:
    base = ensure_model(BASE)
    return _ensure_cached(models_cache_dir(), "test-script", fingerprint(base), lambda out: build(out, base))


def logit_gaps(model_dir: Path, seed: int = 2000) -> np.ndarray:
    """Per scripted token of one held-out variant: its logit minus the best other token's (for reports)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    gaps = []
    for messages, tools, reply in script(_Variants(seed)):
        full, n_prompt = _example(tok, messages, tools, reply)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([full])).logits[0, n_prompt - 1 : -1]
        target = torch.tensor(full[n_prompt:])
        chosen = logits.gather(1, target[:, None])[:, 0]
        logits.scatter_(1, target[:, None], float("-inf"))
        gaps.append((chosen - logits.max(1).values).numpy())
    return np.concatenate(gaps)
