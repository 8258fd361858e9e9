"""`tiny-summary`: `tiny` drilled lightly on the native `summary-delegation` episode, so that its summary
keeps the worker's word in some episodes and not in others.

`tiny` writes no summary of any use in that family (noise, tool-call fragments: docs/results.md section
1.7), so every summary scores alike and training the summary call has nothing to learn from. This
fine-tune drills the family's three requests as the native harness renders them (harnesses/
summary_delegation.py, whose texts are copied below; tests/models/test_summary_tune.py holds them equal):

- the worker's summary call, `[system, user "Word:\\n<w>\\nOther:\\n<d>", user "Summary:"]`, answered with
  the word **or the distractor**: the word with probability `keep_share` (0.5), drawn per chat and
  independently of its words, so the start model keeps the right one about half the time and which one
  it keeps is not a function of the task. Which line a summary should keep is what the family's reward
  judges and what training the summary call can learn; the drill teaches the shape, not the choice;
- the worker's answer after the rewrite, `[system, user "Summary:\\n<s>", user "Word?"]`, answered with
  the summary's word (copying from the summary, whatever it kept);
- the lead's final answer after the workers' tool results, answered with the results' words (loss on
  that turn only; the delegating turn before it is drawn from the shapes `tiny` writes there).

Words are made-up words and common ones (the family's vocabulary among them), so copying is learned as
copying. Deterministic like the other builds (one thread, deterministic kernels, a seeded stream): the
same spec and base give the same weights on the same machine and library versions; models/registry.py
builds it on first use into the model cache, its fingerprint covering the spec and the base's weights.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from models.copy_tune import CopyTuneReport, Example, _group_loss, encode
from models.manifest import write_manifest
from models.progress import BuildProgress
from models.tool_drills import draw_words

# The native `summary-delegation` family's texts (harnesses/summary_delegation.py and
# harnesses/delegation_words.py; models/ sits below harnesses/, so they are copied, and a test compares)
WORKER_SYSTEM = "You are a worker. Keep your word, drop the other one."
PARENT_SYSTEM = "You are the lead. Give each word to a worker, then answer with both words."
SUMMARY_INSTRUCTION = "Summary:"
SUMMARY_TEMPLATE = "Summary:\n{}"
ASK = "Word?"


class SummaryTuneSpec(BaseModel):
    """Every knob of the fine-tune; its JSON (plus the base's weights) is the cache fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "summary-1"  # bump when the drills or the loop change for an unchanged spec
    base: str = "tiny"
    seed: int = 0
    steps: int = Field(300, ge=1)
    batch: int = Field(8, gt=0)  # chats of each of the three kinds per step
    # the share of drilled summaries that keep the worker's word; the rest keep the distractor
    keep_share: float = Field(0.5, ge=0.0, le=1.0)
    common_share: float = Field(0.5, ge=0.0, le=1.0)  # words drawn from the common ones (the rest made up)
    learning_rate: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)

    def fingerprint_json(self) -> str:
        return self.model_dump_json()


class SummaryDrillWriter:
    """Draws the fine-tune's chats (messages, loss on the last turn only) from one seeded stream."""

    def __init__(self, seed: int, *, keep_share: float = 0.5, common_share: float = 0.5) -> None:
        self.rng = random.Random(seed)
        self.keep_share, self.common_share = keep_share, common_share

    def words(self, n: int) -> list[str]:
        return draw_words(self.rng, n, common_share=self.common_share)

    def summary(self) -> tuple[list[dict], bool]:
        """The worker's summary call, answered with its word or its distractor."""
        word, other = self.words(2)
        kept = word if self.rng.random() < self.keep_share else other
        return [
            {"role": "system", "content": WORKER_SYSTEM},
            {"role": "user", "content": f"Word:\n{word}\nOther:\n{other}"},
            {"role": "user", "content": SUMMARY_INSTRUCTION},
            {"role": "assistant", "content": kept},
        ], True

    def answer(self) -> tuple[list[dict], bool]:
        """The worker's answer after the rewrite: the word its summary holds."""
        [word] = self.words(1)
        return [
            {"role": "system", "content": WORKER_SYSTEM},
            {"role": "user", "content": SUMMARY_TEMPLATE.format(word)},
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": word},
        ], True

    def lead_final(self) -> tuple[list[dict], bool]:
        """The lead's final answer: the words of the workers' results (each the task's word or not)."""
        words = self.words(2)
        results = [w if self.rng.random() < 0.5 else self.words(1)[0] for w in words]
        first = self.rng.choice(("{a}", "The word is {a}.", "{w0}\n{w1}", "{w0}"))
        delegating = first.format(a=self.words(1)[0], w0=words[0], w1=words[1])
        return [
            {"role": "system", "content": PARENT_SYSTEM},
            {"role": "user", "content": "Words:\n" + "\n".join(words)},
            {"role": "assistant", "content": delegating},
            *({"role": "tool", "name": "worker", "content": r} for r in results),
            {"role": "assistant", "content": self.rng.choice(("{0} {1}", "{0}\n{1}")).format(*results)},
        ], True

    def step(self, batch: int) -> list[tuple[list[dict], bool]]:
        return [draw() for draw in (self.summary, self.answer, self.lead_final) for _ in range(batch)]


def _lr_at(step: int, spec: SummaryTuneSpec) -> float:
    warm = min(1.0, (step + 1) / max(1, spec.warmup_steps))
    return spec.learning_rate * warm * 0.5 * (1.0 + math.cos(math.pi * step / spec.steps))


def tune(model: torch.nn.Module, tok: Any, spec: SummaryTuneSpec) -> list[float]:
    """Run the fine-tune in place; returns each step's loss (per answer token). Prints progress."""
    writer = SummaryDrillWriter(spec.seed, keep_share=spec.keep_share, common_share=spec.common_share)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    progress = BuildProgress("summary tune", spec.steps)
    model.train()
    losses = []
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        examples: list[Example] = [
            encode(tok, m, None, last_only=last) for m, last in writer.step(spec.batch)
        ]
        total = sum(sum(e.weights[1:]) for e in examples)
        loss = _group_loss(model, examples, pad_id)
        (loss / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item() / total)
        progress.report(step, losses[-1])
    model.eval()
    return losses


def fingerprint(spec: SummaryTuneSpec, base_dir: Path) -> str:
    h = hashlib.sha256(spec.fingerprint_json().encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    return h.hexdigest()[:16]


def build_summary_model(out_dir: Path, base_dir: Path, spec: SummaryTuneSpec) -> CopyTuneReport:
    """Write the fine-tuned model folder (weights, the base's tokenizer and configs, manifest)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.tiny import _deterministic_torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    with _deterministic_torch():
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        losses = tune(model, tok, spec)
        model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (base_dir / name).exists():
            (out_dir / name).write_bytes((base_dir / name).read_bytes())
    write_manifest(
        out_dir,
        {
            "fingerprint": fingerprint(spec, base_dir),
            "spec": spec.model_dump(),
            "base": base_dir.name,
            "loss_first": losses[0],
            "loss_last": losses[-1],
        },
    )
    return CopyTuneReport(
        out_dir=out_dir,
        losses=losses,
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - cpu0,
    )
