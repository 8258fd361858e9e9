"""Build grove's locally made tiny causal LM: a Hugging Face folder that vLLM and transformers load offline.

Nothing can be downloaded from a model hub here, so the model is made from scratch: a byte-level BPE
tokenizer trained on the synthetic corpus (models/tokenizer.py, models/corpus.py), a Qwen3 decoder
initialised from the seed, then optionally a short AdamW pretraining so that sampled text is not
uniform noise. The pretraining may start with `drill_steps` steps on plain copy drills
(`generate_copy_drills`) before `pretrain_steps` steps on the corpus: a model this small does not
learn to copy a word from its prompt out of the mixed corpus in a budget of a few hundred steps,
while the drills teach it (from init_std 0.06) and the corpus steps that follow keep part of it. The
shape respects vLLM-CPU's attention kernel (head_dim 32).

The build is deterministic: one torch thread, deterministic algorithms, a seeded generator for the
init and one for the batch order. The same spec gives byte-identical files on the same machine and
library versions. `TinyModelSpec.fingerprint()` names the cache entry (models/registry.py).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.corpus import generate_copy_drills, generate_corpus
from models.manifest import write_manifest
from models.progress import BuildProgress
from models.tokenizer import END_OF_TEXT, IM_END, IM_START, save_tokenizer, train_tokenizer
from models.tool_drills import Shape, generate_tool_drills, harness_texts

log = logging.getLogger(__name__)

# Bump when the builder's output changes for an unchanged spec: it is part of every fingerprint.
BUILDER_VERSION = "tiny-3"


class NonDeterministicBuildError(RuntimeError):
    """The process cannot pin torch to one thread, so the build would not be byte-reproducible."""


class ToolDrillSpec(BaseModel):
    """The tool-calling phases of a `tiny-tools` build (models/tool_drills.py), after the corpus steps:
    `short_steps` on compact dialogues in short windows, then `long_steps` on dialogues with OpenCode's
    full prompt text in long windows. Windows start at dialogue starts. Prompt tokens (everything but
    the assistant's turns) weigh `prompt_loss_weight` in the loss: the signal is in the answers (the
    copied words), which a plain mean over ~1,000-token prompts would dilute."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Names the drill generator's output (models/tool_drills.py, its captured OpenCode text): bump it
    # when they change, so the cache fingerprint does.
    drills_version: str = "opencode-1.18.33-2"
    short_documents: int = Field(6000, gt=0)
    short_steps: int = Field(0, ge=0)
    short_seq_len: int = Field(512, gt=1)
    short_batch_size: int = Field(16, gt=0)
    long_documents: int = Field(1500, gt=0)
    long_steps: int = Field(0, ge=0)
    long_seq_len: int = Field(2048, gt=1)
    long_batch_size: int = Field(4, gt=0)
    prompt_loss_weight: float = Field(0.1, ge=0, le=1)
    # copies of OpenCode's captured request texts in the tokenizer's training text: its fixed prompt
    # text then takes ~2x fewer tokens (the `task` schema and the default agent's prompt)
    harness_text_copies: int = Field(4, ge=0)
    tokenizer_documents: int = Field(1000, ge=0)  # long drills added to the tokenizer's training text


class TinyModelSpec(BaseModel):
    """Every knob of the tiny model build; its JSON (plus BUILDER_VERSION) is the cache fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: Literal["qwen3"] = "qwen3"
    seed: int = 0
    vocab_size: int = Field(2048, ge=512)
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    # vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ... only.
    head_dim: Literal[32, 64, 80, 96, 112, 128] = 32
    intermediate_size: int = Field(384, gt=0)
    max_position_embeddings: int = Field(2048, gt=0)
    rope_theta: float = 10000.0
    init_std: float = Field(0.02, gt=0)
    corpus_documents: int = Field(4000, gt=0)
    drill_documents: int = Field(4000, gt=0)
    drill_steps: int = Field(0, ge=0)  # copy-drill steps, before the corpus steps
    pretrain_steps: int = Field(0, ge=0)  # corpus steps
    batch_size: int = Field(16, gt=0)
    seq_len: int = Field(256, gt=1)
    learning_rate: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    tools: ToolDrillSpec | None = None  # None: no tool-calling phases (the "tiny" model)

    @model_validator(mode="after")
    def _check_consistency(self) -> TinyModelSpec:
        # pydantic turns these ValueErrors into its typed ValidationError, with our message inside.
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelSpec: num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention); change one of them."
            )
        lengths = {"seq_len": self.seq_len}
        if self.tools is not None:
            lengths |= {
                "tools.short_seq_len": self.tools.short_seq_len,
                "tools.long_seq_len": self.tools.long_seq_len,
            }
        for name, length in lengths.items():
            if length > self.max_position_embeddings:
                raise ValueError(
                    f"TinyModelSpec: {name}={length} exceeds max_position_embeddings="
                    f"{self.max_position_embeddings}; lower {name}."
                )
        return self

    @property
    def total_steps(self) -> int:
        tool_steps = self.tools.short_steps + self.tools.long_steps if self.tools else 0
        return self.drill_steps + self.pretrain_steps + tool_steps

    def untrained(self) -> TinyModelSpec:
        """This spec with every step count 0: the same tokenizer (trained on the same corpus and extra
        text, which no step count changes), shape, positions and chat template, with random weights, built
        in seconds. For a caller that needs a trained build's tokenizer or positions, never its replies."""
        tools = self.tools and self.tools.model_copy(update={"short_steps": 0, "long_steps": 0})
        return self.model_copy(update={"drill_steps": 0, "pretrain_steps": 0, "tools": tools})

    def fingerprint(self) -> str:
        """16 hex chars of sha256(BUILDER_VERSION + spec JSON): the cache entry's name suffix. `tools` is
        left out when None, so specs without tool phases keep their fingerprints (their cached builds stay
        valid)."""
        payload = (
            BUILDER_VERSION + "\n" + self.model_dump_json(exclude={"tools"} if self.tools is None else None)
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class TinyBuildReport(BaseModel):
    """What a build produced (grove_model.json in the folder keeps its deterministic part)."""

    out_dir: Path
    fingerprint: str
    num_parameters: int
    losses: list[float]  # pretraining loss per step (empty without pretraining)
    seconds_total: float
    seconds_pretrain: float
    cpu_seconds_total: float = 0.0  # this process's CPU time: the cost on a shared machine


@contextmanager
def _deterministic_torch(num_threads: int = 1):
    """`num_threads` threads (a fixed count: reductions split another way round differently), deterministic
    kernels and a private RNG state; restores the caller's settings."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(num_threads)
    if torch.get_num_threads() != num_threads:
        raise NonDeterministicBuildError(
            f"model build: torch.set_num_threads({num_threads}) had no effect (still "
            f"{torch.get_num_threads()} threads; vLLM's in-process engine replaces it with a no-op), so the "
            "build would not be reproducible; build the model in a process that has not started a vLLM "
            "engine."
        )
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)


def _special_id(tok: Any, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:  # train_tokenizer adds every special token
        raise ValueError(f"the trained tokenizer has no id for its special token {token!r}")
    return token_id


def _hf_config(spec: TinyModelSpec, *, eos_id: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        # transformers 5 still takes the legacy rope_theta (into rope_parameters); its signature omits it
        rope_theta=spec.rope_theta,  # type: ignore[call-arg]
        initializer_range=spec.init_std,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
    )


def _init_weights(model: torch.nn.Module, spec: TinyModelSpec) -> None:
    """Our own init, in sorted parameter order from a seeded generator, so the weights do not depend on
    transformers' init code: norms = 1, every matrix ~ N(0, init_std)."""
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * spec.init_std)


def _token_stream(tok: Any, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id(END_OF_TEXT)
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


def _lr_at(step: int, spec: TinyModelSpec) -> float:
    """Warmup, then one cosine over all steps together (drills, corpus, tool phases)."""
    warm = min(1.0, (step + 1) / max(1, spec.warmup_steps))
    return spec.learning_rate * warm * 0.5 * (1.0 + math.cos(math.pi * step / spec.total_steps))


ASSISTANT_OPEN = IM_START + "assistant\n"


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the assistant turns' bodies in a rendered chat, each with its <|im_end|>."""
    spans, at = [], text.find(ASSISTANT_OPEN)
    while at >= 0:
        body = at + len(ASSISTANT_OPEN)
        end = text.find(IM_END, body)
        end = len(text) if end < 0 else end + len(IM_END)
        spans.append((body, end))
        at = text.find(ASSISTANT_OPEN, end)
    return spans


@dataclass(frozen=True)
class _Phase:
    """Windows of one training phase: a token stream, per-token loss weights, window starts."""

    tokens: torch.Tensor  # int64 [N + seq_len] (padded so every start has a full window)
    weights: torch.Tensor | None  # float32, like tokens; None: plain mean
    starts: torch.Tensor | None  # int64 [D] document starts to draw from; None: any offset
    seq_len: int
    batch_size: int
    steps: int


def _weighted_stream(
    tok: Any, docs: list[str], prompt_weight: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, weights, document starts): assistant-turn tokens weigh 1, the rest `prompt_weight`."""
    eot = tok.token_to_id(END_OF_TEXT)
    ids: list[int] = []
    weights: list[float] = []
    starts: list[int] = []
    for text, enc in zip(docs, tok.encode_batch(docs), strict=True):
        starts.append(len(ids))
        spans = assistant_spans(text)
        ids.extend(enc.ids)
        weights.extend(1.0 if any(a <= s < b for a, b in spans) else prompt_weight for s, _ in enc.offsets)
        ids.append(eot)
        weights.append(prompt_weight)
    return np.asarray(ids, np.int64), np.asarray(weights, np.float32), np.asarray(starts, np.int64)


def _tool_phases(tok: Any, spec: TinyModelSpec) -> list[_Phase]:
    tools = spec.tools
    if tools is None:
        return []
    phases = []
    shapes: tuple[tuple[Shape, int, int, int, int, int], ...] = (
        ("short", tools.short_documents, tools.short_steps, tools.short_seq_len, tools.short_batch_size, 3),
        ("long", tools.long_documents, tools.long_steps, tools.long_seq_len, tools.long_batch_size, 4),
    )
    for shape, n_docs, steps, seq_len, batch, seed in shapes:
        if not steps:
            continue
        docs = generate_tool_drills(spec.seed + seed, n_documents=n_docs, shape=shape)
        ids, weights, starts = _weighted_stream(tok, docs, tools.prompt_loss_weight)
        pad = np.full(seq_len, tok.token_to_id(END_OF_TEXT), np.int64)
        phases.append(
            _Phase(
                tokens=torch.from_numpy(np.concatenate([ids, pad])),
                weights=torch.from_numpy(np.concatenate([weights, np.zeros(seq_len, np.float32)])),
                starts=torch.from_numpy(starts),
                seq_len=seq_len,
                batch_size=batch,
                steps=steps,
            )
        )
    return phases


def _plain_phase(stream: np.ndarray, steps: int, spec: TinyModelSpec) -> _Phase:
    return _Phase(torch.from_numpy(stream), None, None, spec.seq_len, spec.batch_size, steps)


def _batch(phase: _Phase, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    offsets = torch.arange(phase.seq_len)
    if phase.starts is None:
        starts = torch.randint(0, len(phase.tokens) - phase.seq_len, (phase.batch_size,), generator=gen)
    else:
        starts = phase.starts[torch.randint(0, len(phase.starts), (phase.batch_size,), generator=gen)]
    index = starts[:, None] + offsets
    return phase.tokens[index], None if phase.weights is None else phase.weights[index]


def _loss(logits: torch.Tensor, batch: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    flat_logits, targets = logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
    if weights is None:
        return torch.nn.functional.cross_entropy(flat_logits, targets)
    w = weights[:, 1:].reshape(-1)
    per_token = torch.nn.functional.cross_entropy(flat_logits, targets, reduction="none")
    return (per_token * w).sum() / w.sum().clamp_min(1e-6)


def _pretrain(model: torch.nn.Module, phases: list[_Phase], spec: TinyModelSpec) -> list[float]:
    """AdamW over the phases in order (copy drills, corpus, tool drills); returns each step's loss."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    opt = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=spec.weight_decay
    )
    losses = []
    model.train()
    schedule = [phase for phase in phases for _ in range(phase.steps)]
    progress = BuildProgress("tiny build", len(schedule))
    for step, phase in enumerate(schedule):
        batch, weights = _batch(phase, gen)
        loss = _loss(model(input_ids=batch).logits, batch, weights)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        progress.report(step, losses[-1])
    model.eval()
    return losses


def _save_generation_config(out_dir: Path, *, im_end_id: int, eot_id: int) -> None:
    from transformers import GenerationConfig

    # Chat turns end with <|im_end|>: listing it first makes vLLM and HF generate stop there.
    # Plain sampling defaults (no top-k/top-p) so behaviour logprobs are those of the raw policy.
    GenerationConfig(
        eos_token_id=[im_end_id, eot_id],
        pad_token_id=eot_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    ).save_pretrained(str(out_dir))


def _write_manifest(out_dir: Path, spec: TinyModelSpec, num_parameters: int, losses: list[float]) -> None:
    manifest = {
        "builder_version": BUILDER_VERSION,
        "fingerprint": spec.fingerprint(),
        "spec": spec.model_dump(),
        "num_parameters": num_parameters,
        "pretrain_loss_first": losses[0] if losses else None,
        "pretrain_loss_last": losses[-1] if losses else None,
    }
    write_manifest(out_dir, manifest)


def build_tiny_model(out_dir: Path, spec: TinyModelSpec | None = None, **knobs: Any) -> TinyBuildReport:
    """Write a complete HF model folder for `spec` (or TinyModelSpec(**knobs)) into `out_dir`.

    `out_dir` is created if missing; files in it are overwritten. Callers that need atomicity build
    into a temporary folder and rename it (models/registry.py does).
    """
    from transformers import Qwen3ForCausalLM

    spec = spec if spec is not None else TinyModelSpec(**knobs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    docs = generate_corpus(spec.seed, n_documents=spec.corpus_documents)
    tok = train_tokenizer(docs + _tokenizer_extra_text(spec), vocab_size=spec.vocab_size)
    eot_id, im_end_id = _special_id(tok, END_OF_TEXT), _special_id(tok, IM_END)
    with _deterministic_torch():
        model = Qwen3ForCausalLM(_hf_config(spec, eos_id=eot_id))
        _init_weights(model, spec)
        t1 = time.perf_counter()
        losses = []
        if spec.total_steps:
            drills = (
                generate_copy_drills(spec.seed + 2, n_documents=spec.drill_documents)
                if spec.drill_steps
                else []
            )
            phases = [
                _plain_phase(_token_stream(tok, drills), spec.drill_steps, spec),
                _plain_phase(_token_stream(tok, docs), spec.pretrain_steps, spec),
                *_tool_phases(tok, spec),
            ]
            losses = _pretrain(model, phases, spec)
        t2 = time.perf_counter()
        model.save_pretrained(str(out_dir))
    num_parameters = sum(p.numel() for p in model.parameters())
    save_tokenizer(tok, out_dir, model_max_length=spec.max_position_embeddings)
    _save_generation_config(out_dir, im_end_id=im_end_id, eot_id=eot_id)
    _write_manifest(out_dir, spec, num_parameters, losses)
    return TinyBuildReport(
        out_dir=out_dir,
        fingerprint=spec.fingerprint(),
        num_parameters=num_parameters,
        losses=losses,
        seconds_total=time.perf_counter() - t0,
        seconds_pretrain=t2 - t1,
        cpu_seconds_total=time.process_time() - cpu0,
    )


def _tokenizer_extra_text(spec: TinyModelSpec) -> list[str]:
    """Tool builds also train the tokenizer on their drills and on OpenCode's captured prompt text."""
    if spec.tools is None:
        return []
    n_docs = spec.tools.tokenizer_documents
    return generate_tool_drills(spec.seed + 5, n_documents=n_docs, shape="long") + harness_texts() * (
        spec.tools.harness_text_copies
    )
