"""Model shapes and utilisation for bench/bench_learner.py: random-init models of real dimensions, the
FLOPs of a learner micro-batch, and the device's measured matmul peak.

`build_shape_model` writes a Hugging Face folder (config, random float32 weights, the tiny model's
tokenizer files, which only the demo-shaped scenario reads) that `Learner` loads like any model.
Shapes: "tiny" (the tiny-random model's dimensions) and "qwen3-0.6b" (hidden 1024, 28 layers, 16 query
/ 8 key-value heads of 128, MLP 3072, vocabulary 151,936, tied embeddings: Qwen3-0.6B's config).

MFU (model FLOPs utilisation) of a micro-batch, as the benchmark defines it:

    useful FLOPs = 6 x non-embedding parameters x forwarded tokens      (linear layers, fwd + bwd)
                 + 6 x hidden x vocabulary x scored tokens              (LM head where a token is scored)
                 + 12 x (query, key) pairs x head_dim x query heads x layers   (attention, fwd + bwd)
    MFU          = useful FLOPs / step seconds / measured peak

The peak is measured in the same run: the best of several large matmuls (bf16 on CUDA, float32 on
CPU). Recomputation (activation checkpointing, the chunked LM head's backward) is not useful work and
is not counted.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

SHAPES: dict[str, dict] = {
    "tiny": {},  # the tiny-random model's own config
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151_936,
        "max_position_embeddings": 40_960,
        "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_shape_model(
    shape: str, tokenizer_dir: Path, out_dir: Path, *, vocab: int | None = None, seed: int = 0
) -> Path:
    """A random-init model of `shape` (vocabulary `vocab` if given) in `out_dir`; returns it."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose from {sorted(SHAPES)}")
    base = json.loads((tokenizer_dir / "config.json").read_text())
    overrides = dict(SHAPES[shape])
    if vocab is not None:
        overrides["vocab_size"] = vocab
    layers = overrides.get("num_hidden_layers", base["num_hidden_layers"])
    config_dict = {**base, **overrides, "layer_types": ["full_attention"] * layers}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config_dict))
    config = AutoConfig.from_pretrained(out_dir)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # initialise where it is fast
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    return out_dir


def hf_model(model: torch.nn.Module) -> PreTrainedModel:
    """`model` as the transformers model a Learner loads (its config, its embeddings)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers model, got {type(model).__name__}")
    return model


def parameter_counts(model: PreTrainedModel) -> tuple[int, int]:
    """(non-embedding parameters, embedding parameters): input embeddings and an untied LM head are
    the embedding side; a tied head counts once."""
    embed = {id(p) for p in model.get_input_embeddings().parameters()}
    embed |= {id(p) for p in model.get_output_embeddings().parameters()}
    seen: dict[int, int] = {id(p): p.numel() for p in model.parameters()}
    emb = sum(n for i, n in seen.items() if i in embed)
    return sum(seen.values()) - emb, emb


def micro_batch_flops(config, non_embedding: int, tokens: int, scored: int, pairs: int) -> float:
    """Useful FLOPs of one forward + backward (module docstring)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    linear = 6 * non_embedding * tokens
    head = 6 * config.hidden_size * config.vocab_size * scored
    attention = 12 * pairs * head_dim * heads * config.num_hidden_layers
    return float(linear + head + attention)


def matmul_peak(device: torch.device, *, size: int | None = None, reps: int = 10) -> tuple[float, str]:
    """Best FLOP/s of `reps` square matmuls (bf16 on CUDA, float32 on CPU), and what was measured."""
    cuda = device.type == "cuda"
    n = size or (8192 if cuda else 1024)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 2):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best, f"{str(dtype).removeprefix('torch.')} {n}x{n} matmul"
