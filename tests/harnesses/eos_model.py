"""A real policy that always ends its turn at once: the tiny model's weights edited so that `<|im_end|>`
wins every position by a wide margin. vLLM serves it like any model; its replies are genuinely sampled
EOS-only turns (what OpenCode drops from its next request), not made-up responses.

How: one hidden dimension `d` carries a constant through the residual stream (every token embeds `C`
there, and no attention or MLP block writes to it), so after the final RMSNorm it is positive at every
position; the (untied) LM head reads only that dimension and only for `<|im_end|>`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

DIM = 0  # the constant-carrying hidden dimension
C = 20.0  # its value in every embedding: dominates the RMS, so the normalised value is ~sqrt(hidden)
MARGIN = 50.0  # lm_head weight: <|im_end|> logit ~ MARGIN * sqrt(hidden); every other logit is 0


def build_eos_model(src: Path, dst: Path, end_token: str = "<|im_end|>") -> Path:
    if (dst / "model.safetensors").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            shutil.copy(f, dst / f.name)
    tokens = json.loads((src / "tokenizer.json").read_text())
    end_id = next(t["id"] for t in tokens["added_tokens"] if t["content"] == end_token)
    weights = load_file(str(src / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"].copy()
    embed[:, DIM] = C
    weights["model.embed_tokens.weight"] = embed
    for name, w in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w = w.copy()
            w[DIM, :] = 0.0  # no block writes to the constant dimension
            weights[name] = w
    norm = weights["model.norm.weight"].copy()
    norm[DIM] = 1.0
    weights["model.norm.weight"] = norm
    head = np.zeros_like(embed)
    head[end_id, DIM] = MARGIN
    weights["lm_head.weight"] = head
    save_file(weights, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
