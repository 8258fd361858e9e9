"""`tiny-copy`: `tiny-tools` fine-tuned to copy made-up words, in OpenCode's real request format.

`tiny-tools` emits well-formed `task` calls but copies none of the user's made-up words (docs/results.md
section 2.2), so every `opencode-delegation` episode scores the same and GRPO has nothing to learn from.
Copying a made-up word means copying 4-8 tokens of this tokenizer: it needs induction (attend to the token
after the previous occurrence of the current one), which the tool drills, with one or two words per
dialogue, never taught. This fine-tune teaches it in two phases, from a seeded stream of training-side
made-up words (`tool_drills.is_held_out` words never appear, so evaluation on them measures copying):

- `dense` steps: short chats (~40-150 tokens) where the answer repeats a list of 2-8 words, or one word
  as OpenCode's worker is asked for it; every answer token is a copy target (the loss covers only the
  answers).
- `real` steps: the requests OpenCode sends in an `opencode-delegation` episode, rendered from the
  captured opencode-ai 1.18.33 text (models/harness_text) with the runner's kind of working directory,
  dates and model names drawn: the lead's first request -> two `task` calls carrying the words, a worker's
  request -> its word, the lead's resumption after both task results -> the words; some dense chats stay
  in the mix.
- `resume` steps (optional; `tiny-resume` runs only these, from `tiny-copy`): lead resumptions with the
  loss on the final answer alone (the words read back from the task results, which the real steps did
  not teach well enough), beside first lead turns with every token (so the lead keeps calling) and the
  real steps' workers and dense chats.
- `reader` steps (optional; `tiny-reader` runs only these, from `tiny-resume`): the four requests of an
  `opencode-reader` worker (models/reader_drills.py: the `read` call, the word after the notes, the
  compaction summary, the word again from the summary), several workers of one environment per step,
  beside lead requests, plain workers and dense chats.

Deterministic like the tiny build (one thread, deterministic kernels, seeded data order): the same spec
and base give byte-identical weights on the same machine and library versions. models/registry.py
builds it on first use into the model cache; the fingerprint covers the spec and the base's weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from models import reader_drills, report_drills
from models.manifest import write_manifest
from models.progress import BuildProgress
from models.reader_drills import READER_PROMPT
from models.tool_drills import (
    _DAYS,
    _MONTHS,
    LEAD_PROMPT,
    WORKER_PROMPT,
    WORKER_PROMPTS,
    ToolDrillWriter,
    _env_template,
    draw_words,
    task_tool,
)

log = logging.getLogger(__name__)

WORKER_DESCRIPTION = "Repeats the word it is given."  # harnesses/opencode_delegation.py OPENCODE_AGENTS
_LIST_SYSTEMS = ("Repeat the words.", "Reply with the words you are given.", *WORKER_PROMPTS)
_LIST_ASKS = ('"Words: {ws}"', "Words: {ws}", "Words:\n{lines}", "Repeat: {ws}", "{ws}")
_LIST_ANSWERS = ("{ws}", "{ws}", "{lines}")
_WORKER_ASKS = ("Reply with the word {w}.", "Reply with the word {w}.", "Repeat the word {w}.", "Word: {w}")


class CopyTuneSpec(BaseModel):
    """Every knob of the fine-tune; its JSON (plus the base's weights) is the cache fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "copy-1"  # bump when the drills or the loop change for an unchanged spec
    base: str = "tiny-tools"
    seed: int = 0
    dense_steps: int = Field(500, ge=0)
    dense_batch: int = Field(16, gt=0)
    # every `lead_every`-th dense step also trains `dense_leads` lead requests (the tool-call format
    # is forgotten in a few hundred pure list steps otherwise)
    lead_every: int = Field(4, ge=1)
    dense_leads: int = Field(2, ge=0)
    real_steps: int = Field(150, ge=0)
    real_leads: int = Field(8, gt=0)  # lead requests (first or resumption) per real step, one prefix
    real_workers: int = Field(4, ge=0)
    real_dense: int = Field(4, ge=0)
    # `resume` steps (after the real ones): lead resumptions whose loss is the final answer only (the
    # words read back from the two task results), the part tiny-copy never learned
    resume_steps: int = Field(0, ge=0)
    resume_leads: int = Field(8, gt=0)
    # first lead turns (their `task` calls, full loss) beside each resume step's finals: without them the
    # final-only loss taught the lead to answer at once and stop calling (tiny-resume v1, 200 steps)
    resume_firsts: int = Field(0, ge=0)
    # `reader` steps (after the resume ones): an `opencode-reader` worker's requests (models/reader_drills.py:
    # the read call, the word after the long result, the compaction summary, the word from the summary),
    # `reader_workers` workers per step beside `reader_leads` lead requests of either kind (so the lead's
    # calls and read-back hold) and the real steps' workers and dense chats
    reader_steps: int = Field(0, ge=0)
    reader_workers: int = Field(4, gt=0)
    reader_leads: int = Field(4, ge=0)
    reader_lines: tuple[int, int] = (12, 20)  # notes.txt lines, drawn per worker
    # `report` steps (after the reader ones): reader steps whose workers' reports (the answer after
    # compaction) and leads' resumptions (the task results, the final answer) come in the shapes of
    # models/report_drills.py, at equal odds: `tiny-report`, the `opencode-report` family's start
    report_steps: int = Field(0, ge=0)
    learning_rate: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    max_words: int = Field(8, ge=2)

    @property
    def total_steps(self) -> int:
        return self.dense_steps + self.real_steps + self.resume_steps + self.reader_steps + self.report_steps

    def fingerprint_json(self) -> str:
        """The spec's JSON for the cache fingerprint; without the resume and reader fields while they are
        unused, so builds made before they existed (tiny-copy, tiny-resume) keep their fingerprint."""
        unused = {"resume_steps", "resume_leads", "resume_firsts"} if self.resume_steps == 0 else set()
        if self.reader_steps == 0 and self.report_steps == 0:
            unused |= {"reader_steps", "reader_workers", "reader_leads", "reader_lines"}
        if self.report_steps == 0:
            unused.add("report_steps")
        return self.model_dump_json(exclude=unused)


class CopyTuneReport(BaseModel):
    out_dir: Path
    losses: list[float]
    seconds: float
    cpu_seconds: float


Draw = tuple[list[dict], list[dict] | None, bool]  # messages, tools, loss on the last turn only


@dataclass(frozen=True)
class Example:
    """Token ids of one rendered chat and per-token loss weights (1 inside assistant turns, else 0)."""

    ids: list[int]
    weights: list[float]


# ---- the drills ----------------------------------------------------------------------------------------


def _fill(words: list[str]) -> dict[str, str]:
    return {"ws": " ".join(words), "lines": "\n".join(words)}


def _task_call(word: str) -> dict[str, Any]:
    arguments = {
        "description": f"Answer {word}",
        "prompt": f"Reply with the word {word}.",
        "subagent_type": "worker",
    }
    return {"type": "function", "function": {"name": "task", "arguments": arguments}}


class CopyDrillWriter:
    """Draws the fine-tune's chats (messages, tools) from one seeded stream."""

    def __init__(self, seed: int, *, max_words: int = 8, held_out: bool = False) -> None:
        self.w = ToolDrillWriter(seed, held_out=held_out)
        self.rng = self.w.rng
        self.max_words = max_words
        self.held_out = held_out

    def words(self, n: int) -> list[str]:
        return draw_words(self.rng, n, held_out=self.held_out, common_share=0.05)

    # -- dense chats

    def word_list(self) -> tuple[list[dict], None]:
        fill = _fill(self.words(self.rng.randint(2, self.max_words)))
        return [
            {"role": "system", "content": self.rng.choice(_LIST_SYSTEMS)},
            {"role": "user", "content": self.rng.choice(_LIST_ASKS).format(**fill)},
            {"role": "assistant", "content": self.rng.choice(_LIST_ANSWERS).format(**fill)},
        ], None

    def short_worker(self) -> tuple[list[dict], None]:
        word = self.words(1)[0]
        return [
            {"role": "system", "content": self.rng.choice(WORKER_PROMPTS)},
            {"role": "user", "content": self.rng.choice(_WORKER_ASKS).format(w=word)},
            {"role": "assistant", "content": word},
        ], None

    def dense(self) -> tuple[list[dict], None]:
        return self.word_list() if self.rng.random() < 0.75 else self.short_worker()

    # -- OpenCode's requests in an opencode-delegation episode

    def _folder(self) -> str:
        """Working directories like the harness runner's (a temporary root, an episode folder of 16 hex
        digits, `project`) and plain word paths."""
        rng, name = self.rng, self.w.name
        digits = "".join(rng.choice("0123456789abcdef") for _ in range(16))
        return rng.choice(
            (
                f"/tmp/pytest-of-{name()}/pytest-{rng.randint(0, 9999)}/{name()}{rng.randint(0, 9)}/"
                f"harness/{digits}/project",
                f"/{name()}/{name()}/harness/{digits}/project",
                f"/tmp/{name()}-{digits[: rng.randint(4, 12)]}/project",
                "/" + "/".join(name() for _ in range(rng.randint(1, 4))),
            )
        )

    def _system(self, prompt: str, folder: str | None = None) -> dict[str, str]:
        rng, folder = self.rng, folder or self._folder()
        date = f"{rng.choice(_DAYS)} {rng.choice(_MONTHS)} {rng.randint(1, 28):02d} {rng.randint(2024, 2030)}"
        model = rng.choice(("grove", "policy", self.w.name()))
        env = _env_template().format(dir=folder, provider="grove", model=model, date=date)
        if rng.random() < 0.7:  # outside a git repository, as the runner's folders are
            env = env.replace(f"Workspace root folder: {folder}", "Workspace root folder: /")
            env = env.replace("git repo: yes", "git repo: no")
        return {"role": "system", "content": prompt + env}

    def _lead_start(self, words: list[str], system: dict | None) -> tuple[list[dict], list[dict]]:
        ask = " ".join(words)
        user = {"role": "user", "content": self.rng.choice((f'"Words: {ask}"', f"Words: {ask}"))}
        system = system or self._system(LEAD_PROMPT)
        return [system, user], [task_tool([("worker", WORKER_DESCRIPTION)], "long")]

    def lead_first(self, system: dict | None = None) -> tuple[list[dict], list[dict]]:
        words = self.words(2)
        messages, tools = self._lead_start(words, system)
        calls = {"role": "assistant", "content": "", "tool_calls": [_task_call(w) for w in words]}
        return [*messages, calls], tools

    def worker(self) -> tuple[list[dict], None]:
        word = self.words(1)[0]
        return [
            self._system(WORKER_PROMPT),
            {"role": "user", "content": f"Reply with the word {word}."},
            {"role": "assistant", "content": word},
        ], None

    def lead_resume(self, system: dict | None = None, shaped: bool = False) -> tuple[list[dict], list[dict]]:
        """The lead's resumption after both task results, answered with the words; `shaped`: the results
        and the final answer in shapes drawn from models/report_drills.py."""
        words = self.words(2)
        messages, tools = self._lead_start(words, system)
        calls = {"role": "assistant", "content": "", "tool_calls": [_task_call(w) for w in words]}
        # draws in the order the unshaped drills always made them (the builds made before keep their weights)
        if shaped:
            answers = [self.w.task_result(report_drills.worker_report(self.rng, w)) for w in words]
            text = report_drills.final_answer(self.rng, words)
        else:
            answers = [self.w.task_result(self.rng.choice(("{w}", "{w}", "{w}.")).format(w=w)) for w in words]
            text = self.rng.choice(("{ws}", "{ws}", "{lines}")).format(**_fill(words))
        return [*messages, calls, *answers, {"role": "assistant", "content": text}], tools

    def readers(self, n: int, lines: tuple[int, int], shaped: bool = False) -> tuple[list[Draw], list[Draw]]:
        """`n` `opencode-reader` workers of one episode environment (models/reader_drills.py): their chats
        with the `read` tool (the read call and the word after its result; the word again from the summary,
        loss on it alone), which share the system prompt and tool, and their compaction calls (the summary),
        which share OpenCode's summarization prompt. `shaped`: the answer from the summary (the worker's
        report) in a shape drawn from models/report_drills.py."""
        folder = self._folder()
        system = self._system(READER_PROMPT, folder)["content"]
        tools = [reader_drills.read_tool()]
        with_tool: list[Draw] = []
        summaries: list[Draw] = []
        for word in self.words(n):
            ask = f"Reply with the word {word}."
            notes = reader_drills.notes_text(self.rng, self.rng.randint(*lines))
            result = reader_drills.read_result(folder, notes)
            with_tool.append((reader_drills.worker_turns(system, ask, result, word), tools, False))
            report = report_drills.worker_report(self.rng, word) if shaped else None
            with_tool.append((reader_drills.after_compaction_turns(system, ask, word, report), tools, True))
            summaries.append((reader_drills.summary_turns(ask, result, word), None, False))
        return with_tool, summaries

    def leads(self, n: int, kind: str = "any", shaped: bool = False) -> list[tuple[list[dict], list[dict]]]:
        """`n` lead requests of one episode environment (one system prompt: they share its tokens): first
        requests, resumptions, or (`any`) either at even odds; `shaped`: resumptions as `lead_resume`'s."""
        system = self._system(LEAD_PROMPT)

        def resume(system: dict | None) -> tuple[list[dict], list[dict]]:
            return self.lead_resume(system, shaped=shaped)

        def pick() -> Callable[[dict | None], tuple[list[dict], list[dict]]]:
            if kind == "any":
                return self.lead_first if self.rng.random() < 0.5 else resume
            return {"first": self.lead_first, "resume": resume}[kind]

        return [pick()(system) for _ in range(n)]


def encode(tok: Any, messages: list[dict], tools: list[dict] | None, *, last_only: bool = False) -> Example:
    """Render with the tiny chat template and weigh the assistant turns' tokens (their <|im_end|> too);
    `last_only`: only the last assistant turn's."""
    from models.corpus import render_chat
    from models.tiny import assistant_spans

    text = render_chat(messages, tools)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = assistant_spans(text)[-1:] if last_only else assistant_spans(text)
    weights = [1.0 if any(a <= s < b for a, b in spans) else 0.0 for s, _ in enc["offset_mapping"]]
    return Example(enc["input_ids"], weights)


# ---- the loop ------------------------------------------------------------------------------------------


def _lr_at(step: int, spec: CopyTuneSpec) -> float:
    warm = min(1.0, (step + 1) / max(1, spec.warmup_steps))
    return spec.learning_rate * warm * 0.5 * (1.0 + math.cos(math.pi * step / max(1, spec.total_steps)))


def _pad(batch: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        weights[i, : len(e.ids)] = torch.tensor(e.weights)
    return ids, weights


def _weighted_sum(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    per_token = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    )
    return (per_token * weights[:, 1:].reshape(-1)).sum()


def _group_loss(model: torch.nn.Module, batch: list[Example], pad_id: int) -> torch.Tensor:
    """Sum of weighted token losses of examples padded (on the right) to one width."""
    ids, weights = _pad(batch, pad_id)
    return _weighted_sum(model(input_ids=ids).logits, ids, weights)


def _common_prefix(batch: list[Example]) -> int:
    first, n = batch[0].ids, min(len(e.ids) for e in batch) - 1  # keep a token after it
    for e in batch[1:]:
        n = next((i for i in range(n) if e.ids[i] != first[i]), n)
    return n


def _prefixed_loss(model: torch.nn.Module, batch: list[Example], pad_id: int) -> torch.Tensor:
    """Like `_group_loss` for examples that share a long unweighted prefix (OpenCode's system prompt and
    tool schema, ~1,000 tokens): the prefix runs once, without gradient, and each example's rest attends
    to its keys and values. Gradients then skip the prefix's own activations (they carry no loss), which
    makes a lead request much cheaper to train on."""
    n = _common_prefix(batch)
    if any(any(e.weights[: n + 1]) for e in batch):  # token n is predicted from the prefix: not trained
        raise ValueError(f"copy tune: the shared prefix of {n} tokens holds loss tokens")
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([batch[0].ids[:n]]), use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(batch))
    rest = [Example(e.ids[n:], e.weights[n:]) for e in batch]
    ids, weights = _pad(rest, pad_id)
    return _weighted_sum(model(input_ids=ids, past_key_values=cache, use_cache=True).logits, ids, weights)


@dataclass(frozen=True)
class _Group:
    examples: list[Example]
    shared_prefix: bool = False


def _step_groups(writer: CopyDrillWriter, tok: Any, spec: CopyTuneSpec, step: int) -> list[_Group]:
    """The step's examples in groups of similar length (padding wastes little); lead requests share a
    prefix."""

    def chats(draws: list[tuple[list[dict], Any]]) -> list[Example]:
        return [encode(tok, *d) for d in draws]

    if step < spec.dense_steps:
        groups = [_Group(chats([writer.dense() for _ in range(spec.dense_batch)]))]
        if spec.dense_leads and step % spec.lead_every == spec.lead_every - 1:
            groups.append(_Group(chats(writer.leads(spec.dense_leads)), shared_prefix=True))
        return groups
    if step >= spec.dense_steps + spec.real_steps + spec.resume_steps:  # reader workers, leads beside
        shaped = step >= spec.total_steps - spec.report_steps  # report steps: shaped reports and finals
        with_tool, summaries = writer.readers(spec.reader_workers, spec.reader_lines, shaped=shaped)
        groups = [
            _Group([encode(tok, m, t, last_only=last) for m, t, last in draws], shared_prefix=True)
            for draws in (with_tool, summaries)
        ]
        if spec.reader_leads:
            leads = writer.leads(spec.reader_leads, shaped=shaped)
            groups.append(_Group(chats(leads), shared_prefix=True))
    elif step >= spec.dense_steps + spec.real_steps:  # resume: final answers only, first turns whole
        finals = [encode(tok, *d, last_only=True) for d in writer.leads(spec.resume_leads, "resume")]
        groups = [_Group(finals, shared_prefix=True)]
        if spec.resume_firsts:
            groups.append(_Group(chats(writer.leads(spec.resume_firsts, "first")), shared_prefix=True))
    else:
        groups = [_Group(chats(writer.leads(spec.real_leads)), shared_prefix=True)]
    if spec.real_workers:
        groups.append(_Group(chats([writer.worker() for _ in range(spec.real_workers)])))
    if spec.real_dense:
        groups.append(_Group(chats([writer.dense() for _ in range(spec.real_dense)])))
    return groups


def tune(
    model: torch.nn.Module,
    tok: Any,
    spec: CopyTuneSpec,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Run the fine-tune in place; returns each step's loss (per answer token)."""
    writer = CopyDrillWriter(spec.seed, max_words=spec.max_words)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses = []
    progress = BuildProgress("copy tune", spec.total_steps)
    for step in range(spec.total_steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        groups = _step_groups(writer, tok, spec, step)
        total = sum(sum(e.weights[1:]) for g in groups for e in g.examples)
        loss_sum = 0.0
        for g in groups:  # gradients accumulate; each group's share of the mean
            part = (_prefixed_loss if g.shared_prefix else _group_loss)(model, g.examples, pad_id)
            (part / total).backward()
            loss_sum += part.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss_sum / total)
        progress.report(step, losses[-1])
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def fingerprint(spec: CopyTuneSpec, base_dir: Path) -> str:
    h = hashlib.sha256(spec.fingerprint_json().encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    return h.hexdigest()[:16]


def build_copy_model(
    out_dir: Path,
    base_dir: Path,
    spec: CopyTuneSpec,
    on_step: Callable[[torch.nn.Module, int, float], None] | None = None,
) -> CopyTuneReport:
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
        hook = (lambda step, loss: on_step(model, step, loss)) if on_step else None
        losses = tune(model, tok, spec, hook)
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
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
        },
    )
    return CopyTuneReport(
        out_dir=out_dir,
        losses=losses,
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - cpu0,
    )


# ---- a cheap held-out probe (for builds and experiments; models/tool_eval.py is the full evaluation) ---


def held_out_probe(model: torch.nn.Module, tok: Any, *, n: int = 24, seed: int = 99) -> dict[str, float]:
    """Teacher-forced, greedy per-example exactness of the answers on held-out words: per kind, the share of
    examples whose every answer token is the argmax (what greedy decoding would copy)."""
    writer = CopyDrillWriter(seed, held_out=True)
    kinds: dict[str, Callable[[], tuple[list[dict], list[dict] | None]]] = {
        "list": writer.word_list,
        "worker": writer.worker,
        "lead": writer.lead_first,
        "resume": writer.lead_resume,  # every assistant turn: the calls and the final answer
        "resume_final": writer.lead_resume,  # the final answer alone, the calls given
    }
    out = {}
    model.eval()
    with torch.no_grad():
        for kind, draw in kinds.items():
            exact = []
            for _ in range(n if kind in ("list", "worker") else max(4, n // 3)):
                e = encode(tok, *draw(), last_only=kind == "resume_final")
                ids = torch.tensor([e.ids])
                pred = model(input_ids=ids).logits[0, :-1].argmax(-1).numpy()
                target, w = np.array(e.ids[1:]), np.array(e.weights[1:]) > 0
                exact.append(bool((pred[w] == target[w]).all()))
            out[kind] = sum(exact) / len(exact)
    model.train()
    return out


def dump_probe(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
