"""How a worker starts its engine (`EngineConfig`), and the limits checked before vLLM starts: a context
the model has positions for, a step budget that schedules a whole prompt on CPU, a KV cache that holds
one full context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from activities.engine_errors import KVCacheTooSmallError, StepBudgetTooSmallError
from grove.contracts import DEFAULT_KV_CACHE_BYTES, DEFAULT_MAX_MODEL_LEN, EngineLimits
from models.limits import check_positions, kv_bytes_per_token, model_positions


class EngineConfig(BaseModel):
    """How a worker starts its engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_dir: Path
    initial_version: int = Field(default=0, ge=0)
    dtype: str = "float32"
    max_model_len: int = Field(default=DEFAULT_MAX_MODEL_LEN, ge=16)
    kv_cache_bytes: int = Field(default=DEFAULT_KV_CACHE_BYTES, ge=16 * 2**20)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)  # None: step_token_budget's default
    max_num_seqs: int = Field(default=64, ge=1)
    enforce_eager: bool = True  # eager: torch.compile's startup cost buys nothing at this model size
    enable_prefix_caching: bool = True
    seed: int = 0
    # The model family's tool-call format (chat/tool_parsers.py): grove's "hermes" or the name of a
    # vLLM parser (`--tool-call-parser`), e.g. "qwen3_coder", "llama3_json", "mistral", "pythonic".
    # Checked against the model's tokenizer when the engine starts.
    tool_call_parser: str = "hermes"

    @classmethod
    def from_limits(cls, model_dir: Path, limits: EngineLimits | None, **fields: Any) -> EngineConfig:
        """The config of an engine for `model_dir` under a run's (or a worker's flags') limits."""
        return cls(model_dir=model_dir, **(limits or EngineLimits()).model_dump(), **fields)

    @property
    def step_token_budget(self) -> int:
        """Tokens one engine step may schedule: at least one whole prompt (chunked prefill is off)."""
        return self.max_num_batched_tokens or max(self.max_model_len, 2048)


def check_engine_limits(config: EngineConfig, *, chunked_prefill: bool = False) -> None:
    """Refuse limits the model or the engine cannot honour, with what to change (before vLLM starts)."""
    where = f"engine for model {str(config.model_dir)!r}"
    check_positions(config.max_model_len, model_positions(config.model_dir), where)
    if not chunked_prefill and config.step_token_budget < config.max_model_len:
        raise StepBudgetTooSmallError(
            f"{where}: max_num_batched_tokens={config.step_token_budget} < max_model_len="
            f"{config.max_model_len}; without chunked prefill (CPU) a prompt is scheduled whole, so a long "
            "one would never run: raise --max-num-batched-tokens / engine.max_num_batched_tokens or leave "
            "it unset"
        )
    need = kv_bytes_per_token(config.model_dir, config.dtype) * config.max_model_len
    if config.kv_cache_bytes < need:
        raise KVCacheTooSmallError(
            f"{where}: kv_cache_bytes={config.kv_cache_bytes} cannot hold one context of max_model_len="
            f"{config.max_model_len} tokens ({need} bytes at {config.dtype}); raise --kv-cache-bytes / "
            f"engine.kv_cache_bytes to at least {need} or lower max_model_len"
        )


def scheduling_args(config: EngineConfig, on_cpu: bool) -> dict[str, Any]:
    if on_cpu:
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": config.step_token_budget}
    # GPUs keep chunked prefill; an explicit budget still applies
    return (
        {}
        if config.max_num_batched_tokens is None
        else {"max_num_batched_tokens": config.max_num_batched_tokens}
    )
