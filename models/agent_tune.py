"""Fine-tune a base to call the tools and agent types its prompt offers, then answer: `smol-agent`.

The drills are models/agent_drills.py's six shapes (OpenCode's `task` tool, Agents SDK handoffs, SDK
function tools and agents as tools, LangGraph function tools, Claude Code's `Agent`, Codex's
`spawn_agent`), every one rendered with the base's own chat template; the loss is on the assistant's
turns (the calls and the final answer), none on the prompt. A drill step holds `opencode` cases of one
drawn OpenCode environment, whose long prefix (system prompt, the `task` tool's fixed description) runs
once without gradient (models/copy_tune.py `_prefixed_loss`), and `mixed` cases of the other shapes,
grouped by length so padding wastes little, beside `copy_mix` short chats that repeat made-up names.
With `stock_cases`, a step also holds that many cases of one stock harness (models/stock_drills.py:
Claude Code's and Codex's own request text, in turn), sharing their system prompt and tools as a prefix;
their subagents' chats join the mixed groups.

The registered build (models/registry.py `AGENT_SPECS`) starts from SmolLM2-135M-Instruct, whose
pretraining already copies a made-up name from the prompt. The `induction` and `copy` phases before the
drills are for a base that cannot (a from-scratch `tiny`): they are off in that build, and the tests
run them on the random tiny model.

Deterministic like the other builds (a fixed thread count, deterministic kernels, seeded draws); the
fingerprint covers the spec and the base's weights (cached as `<name>-<fingerprint>`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from models.agent_drills import AgentCase, AgentDrillWriter
from models.copy_tune import Example, _group_loss, _prefixed_loss, encode
from models.manifest import write_manifest
from models.progress import BuildProgress
from models.stock_drills import ALL_SHAPES, STOCK_SHAPES, StockDrills, draw_case

log = logging.getLogger(__name__)


class AgentTuneSpec(BaseModel):
    """Every knob of the fine-tune; its JSON (plus the base's weights) is the cache fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "agent-1"  # bump when the drills or the loop change for an unchanged spec
    base: str = "tiny"
    seed: int = 0
    # `copy` steps first: short chats whose answer repeats a list of made-up names. `tiny` cannot copy a
    # made-up word of 4-8 tokens at all (it needs induction: attend to the token after the earlier
    # occurrence of the current one); these dense copies teach it before the drills ask where to copy from
    # `induction` steps before them: random token sequences repeated once (loss on the repeat), the plain
    # setting in which a small transformer forms induction heads
    induction_steps: int = Field(400, ge=0)
    induction_batch: int = Field(32, gt=0)
    induction_len: int = Field(40, gt=1)  # tokens drawn, then repeated
    induction_chats: int = Field(0, ge=0)  # copy chats beside each induction step's sequences
    copy_steps: int = Field(150, ge=0)
    copy_batch: int = Field(32, gt=0)
    copy_mix: int = Field(8, ge=0)  # copy chats in each drill step, so the copying is kept
    steps: int = Field(100, ge=0)  # drill steps
    opencode_cases: int = Field(4, ge=0)  # per step, one environment (a shared prefix)
    mixed_cases: int = Field(12, ge=0)  # per step, drawn from the other shapes by `mix`
    # per step, cases of one stock harness (Claude Code and Codex in turn: models/stock_drills.py) sharing
    # their system prompt and tools, so that long prefix runs once; their subagents' chats go to the mix
    stock_cases: int = Field(0, ge=0)
    mix: dict[str, float] = {
        "opencode": 0.5,
        "handoff": 1.0,
        "sdk_tools": 1.0,
        "langgraph": 1.0,
        "claude_code": 1.0,
        "codex": 0.5,
    }
    compact_share: float = Field(0.85, ge=0, le=1)  # of the mixed cases (models/agent_drills.py `compact`)
    opencode_every: int = Field(4, ge=1)  # steps between OpenCode groups (the full text is the costly part)
    group_tokens: int = Field(2400, gt=0)  # a padded group holds at most this many tokens
    learning_rate: float = Field(6e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_position_embeddings: int = Field(32768, gt=0)
    # torch threads of the build: a fixed count keeps it reproducible on one machine (reductions split
    # another way round differently); a 135M base wants both cores of a small machine
    threads: int = Field(1, ge=1)

    @property
    def total_steps(self) -> int:
        return self.induction_steps + self.copy_steps + self.steps

    def fingerprint_json(self) -> str:
        """The spec's JSON, without `induction_chats` and `stock_cases` while they are 0 (the builds made
        before they existed keep their fingerprint)."""
        unset = {name for name in ("induction_chats", "stock_cases") if getattr(self, name) == 0}
        return self.model_dump_json(exclude=unset or None)


class AgentTuneReport(BaseModel):
    out_dir: Path
    losses: list[float]
    seconds: float
    cpu_seconds: float


def case_examples(tok: Any, case: AgentCase) -> list[Example]:
    """The chats a case trains: the continued conversation (calls, results, final answer), or after a
    handoff the call request and the receiving agent's request."""
    extra = [encode(tok, messages, tools) for messages, tools in case.extra]
    if case.continued:
        return [encode(tok, case.final_messages, case.final_tools), *extra]
    return [
        encode(tok, case.call_messages, case.call_tools),
        encode(tok, case.final_messages, case.final_tools),
        *extra,
    ]


def _by_length(examples: list[Example], budget: int) -> list[list[Example]]:
    """Groups of examples of similar length, each at most `budget` padded tokens (one at least)."""
    groups: list[list[Example]] = []
    for e in sorted(examples, key=lambda e: len(e.ids)):
        if groups and len(e.ids) * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _mixed_shapes(writer: AgentDrillWriter, spec: AgentTuneSpec) -> list[str]:
    names = [s for s in ALL_SHAPES if s in spec.mix]
    weights = [spec.mix[s] for s in names]
    return writer.rng.choices(names, weights=weights, k=spec.mixed_cases)


def step_groups(
    writer: AgentDrillWriter, tok: Any, spec: AgentTuneSpec, step: int
) -> list[tuple[list[Example], bool]]:
    """One step's groups: (examples, whether they share a prefix)."""
    writer.compact = False
    if step < spec.induction_steps:
        chats = [encode(tok, *copy_chat(writer)) for _ in range(spec.induction_chats)]
        return [
            (induction_batch(writer, tok, spec), False),
            *((g, False) for g in _by_length(chats, spec.group_tokens)),
        ]
    if step < spec.induction_steps + spec.copy_steps:
        return [
            (g, False)
            for g in _by_length(
                [encode(tok, *copy_chat(writer)) for _ in range(spec.copy_batch)], spec.group_tokens
            )
        ]
    groups: list[tuple[list[Example], bool]] = []
    if spec.opencode_cases and step % spec.opencode_every == 0:
        writer.compact = False
        env = writer.opencode_env()
        cases = [writer.opencode(env) for _ in range(spec.opencode_cases)]
        examples = [e for c in cases for e in case_examples(tok, c)]
        groups.append((examples, len(examples) > 1))  # one chat alone has no prefix to share
    mixed = [encode(tok, *copy_chat(writer)) for _ in range(spec.copy_mix)]
    if spec.stock_cases:
        stock = StockDrills(writer)
        shape = STOCK_SHAPES[step % len(STOCK_SHAPES)]
        shared = stock.env(shape)
        cases = [stock.case(shape, shared) for _ in range(spec.stock_cases)]
        leads = [case_examples(tok, c) for c in cases]
        groups.append(([e[0] for e in leads], len(leads) > 1))
        mixed += [e for lead in leads for e in lead[1:]]
    for shape in _mixed_shapes(writer, spec):
        # a full OpenCode case costs ~2,000 tokens: those train in the shared-prefix group only
        writer.compact = shape == "opencode" or writer.rng.random() < spec.compact_share
        mixed += case_examples(tok, draw_case(writer, shape))
    groups += [(g, False) for g in _by_length(mixed, spec.group_tokens)]
    return groups


def _lr_at(step: int, spec: AgentTuneSpec) -> float:
    warm = min(1.0, (step + 1) / max(1, spec.warmup_steps))
    return spec.learning_rate * warm * 0.5 * (1.0 + math.cos(math.pi * step / max(1, spec.total_steps)))


_COPY_SEPARATORS = (" ", ", ", "\n", " | ")
_COPY_ASKS = ("Names: {l}", "Repeat: {l}", "Copy these:\n{l}", "{l}")


def induction_batch(writer: AgentDrillWriter, tok: Any, spec: AgentTuneSpec) -> list[Example]:
    """Sequences of `induction_len` random ordinary tokens, then the same tokens again (the loss on those)."""
    rng, n = writer.rng, spec.induction_len
    special = set(tok.all_special_ids) | {
        tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")
    }
    ordinary = [i for i in range(len(tok)) if i not in special]
    out = []
    for _ in range(spec.induction_batch):
        seq = [rng.choice(ordinary) for _ in range(n)]
        out.append(Example(seq + seq, [0.0] * (n + 1) + [1.0] * (n - 1)))
    return out


def copy_chat(writer: AgentDrillWriter) -> tuple[list[dict[str, Any]], None]:
    """A short chat whose answer repeats a list of 2-6 made-up names (agent, tool and word shapes)."""
    rng = writer.rng
    draws = (lambda: writer.agent_name("-"), writer.tool_name, writer.sdk_agent_name, writer.made_up)
    names = writer.distinct(lambda: rng.choice(draws)(), rng.randint(2, 6))
    listing = rng.choice(_COPY_SEPARATORS).join(names)
    return [
        {"role": "user", "content": rng.choice(_COPY_ASKS).format(l=listing)},
        {"role": "assistant", "content": listing},
    ], None


def tune(
    model: torch.nn.Module,
    tok: Any,
    spec: AgentTuneSpec,
    on_step: Callable[[int, float], None] | None = None,
    probe_every: int = 0,
) -> list[float]:
    """Run the fine-tune in place; returns each step's loss (per assistant token). `probe_every`: log
    `copy_probe` every so many steps (a diagnostic; it changes nothing the build writes)."""
    writer = AgentDrillWriter(spec.seed)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses = []
    progress = BuildProgress("agent tune", spec.total_steps)
    for step in range(spec.total_steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        groups = step_groups(writer, tok, spec, step)
        total = sum(sum(e.weights[1:]) for g, _ in groups for e in g)
        loss_sum = 0.0
        for examples, shared in groups:  # gradients accumulate; each group's share of the mean
            part = (_prefixed_loss if shared else _group_loss)(model, examples, pad_id)
            (part / total).backward()
            loss_sum += part.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss_sum / total)
        progress.report(step, losses[-1])
        if on_step is not None:
            on_step(step, losses[-1])
        if probe_every and (step + 1) % probe_every == 0:
            log.info("agent tune: step %d held-out copy probe %s", step + 1, copy_probe(model, tok))
    model.eval()
    return losses


def copy_probe(model: torch.nn.Module, tok: Any, n: int = 16) -> float:
    """Teacher-forced greedy exactness of held-out copy chats' answers (the share whose every answer token is
    the argmax): whether the copying a build needs has formed."""
    writer = AgentDrillWriter(99, held_out=True)
    exact = 0
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            e = encode(tok, *copy_chat(writer))
            pred = model(input_ids=torch.tensor([e.ids])).logits[0, :-1].argmax(-1).tolist()
            exact += all(p == t for p, t, w in zip(pred, e.ids[1:], e.weights[1:], strict=True) if w)
    model.train()
    return exact / n


def fingerprint(spec: AgentTuneSpec, base_dir: Path) -> str:
    h = hashlib.sha256(spec.fingerprint_json().encode())
    h.update((base_dir / "model.safetensors").read_bytes())
    return h.hexdigest()[:16]


def build_agent_model(
    out_dir: Path,
    base_dir: Path,
    spec: AgentTuneSpec,
    on_step: Callable[[torch.nn.Module, int, float], None] | None = None,
    probe_every: int = 0,
) -> AgentTuneReport:
    """Write the fine-tuned model folder (weights, tiny's tokenizer and template, the raised positions)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.tiny import _deterministic_torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    with _deterministic_torch(spec.threads):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        hook = (lambda step, loss: on_step(model, step, loss)) if on_step else None
        losses = tune(model, tok, spec, hook, probe_every)
        model.config.max_position_embeddings = spec.max_position_embeddings
        model.save_pretrained(str(out_dir))
    tok.model_max_length = spec.max_position_embeddings
    tok.save_pretrained(str(out_dir))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (base_dir / name).exists():
            (out_dir / name).write_bytes((base_dir / name).read_bytes())
    write_manifest(
        out_dir,
        {
            "fingerprint": fingerprint(spec, base_dir),
            "spec": json.loads(spec.model_dump_json()),
            "base": base_dir.name,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
        },
    )
    return AgentTuneReport(
        out_dir=out_dir,
        losses=losses,
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - cpu0,
    )
