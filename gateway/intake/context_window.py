"""Does a chat request fit the served model's context? Answered before anything is admitted.

The engines serve one model with a context of `max_model_len` tokens (prompt + completion). The gateway
knows both from its settings (`policy_model`: the registry name or folder `grove worker --model` got;
`max_model_len`: the engines' context) and loads that model's tokenizer once at startup. For each
request it builds the call's prompt ids with *the same function the generate activity runs*
(capture.prompt.build_prompt): a fresh render for a root, the parent's staged prompt + completion
ids plus the rendered suffix for a continuation. So the length it measures is the length the engine
would get, token for token, and:

- a prompt that leaves no room for one generated token is refused with OpenAI's 400
  `context_length_exceeded` (clients such as OpenCode compact on it; a 502 would be retried);
- `max_tokens` at or above the context can never be generated and is refused (400) at parse time;
- a prompt that fits but leaves less room than `max_tokens` is admitted: the engine stops the
  completion at the context's end (finish_reason "length").

Rendering errors found here (a template that cannot render the messages) are refused the same way,
instead of failing in the activity after admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capture.prompt import build_prompt
from gateway.intake.capture_request import InvalidSamplingError, RequestError
from grove.contracts import PromptSpec
from grove.sampling import SamplingConfig
from storage.base import ObjectStore

OPENAI_CODE = "context_length_exceeded"


class ContextLengthExceededError(RequestError):
    """The prompt leaves no room for a generated token in the served model's context (HTTP 400,
    code `context_length_exceeded` as OpenAI's API names it)."""

    openai_code = OPENAI_CODE


class MaxTokensOverContextError(InvalidSamplingError):
    """max_tokens / max_completion_tokens at or above the whole context: never possible."""


def check_max_tokens(
    request: object, max_model_len: int, params: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
) -> None:
    """Refuse a completion budget no prompt leaves room for (e.g. 2**64); `params`: the wire request's
    budget fields."""
    for param in params:
        value = getattr(request, param)
        if value is not None and value >= max_model_len:
            raise MaxTokensOverContextError(
                f"{param}={value} can never be generated: the served model's context holds {max_model_len} "
                f"tokens, prompt included (max_model_len = {max_model_len}); ask for at most "
                f"{max_model_len - 1} and leave room for the prompt",
                param=param,
            )


def model_stop_ids(model_dir: Path, tokenizer: Any) -> frozenset[int]:
    """The ids that end a generation of this model, as the engine derives them (the tokenizer's EOS
    plus generation_config.json's eos_token_id): the chat render strips them from a derived response."""
    from transformers import GenerationConfig

    try:
        extra = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json
        extra = None
    extra = [extra] if isinstance(extra, int) else list(extra or [])
    eos = tokenizer.eos_token_id
    return frozenset([*([eos] if eos is not None else []), *extra])


@dataclass(frozen=True)
class ContextWindow:
    """The served model's tokenizer and context, and where staged parents are read from."""

    tokenizer: Any
    stop_ids: frozenset[int]
    max_model_len: int
    store: ObjectStore

    @classmethod
    def load(cls, policy_model: str, max_model_len: int, store: ObjectStore) -> ContextWindow:
        """Resolve the model like `grove worker --model` does and load its tokenizer (blocking).

        Raises models.limits.ContextExceedsModelError when `max_model_len` is past the model's
        max_position_embeddings: no engine serves such a context (the worker refuses to start one), so
        the gateway would admit prompts that every engine then refuses, or that run on positions the
        model never learned."""
        from transformers import AutoTokenizer

        from models.limits import check_positions, model_positions
        from models.registry import ensure_model

        model_dir = ensure_model(policy_model)
        check_positions(max_model_len, model_positions(model_dir), f"gateway for model {policy_model!r}")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(tokenizer, model_stop_ids(model_dir, tokenizer), max_model_len, store)

    def prompt_len(self, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig) -> int:
        stop_ids = self.stop_ids | frozenset(sampling.stop_token_ids)
        return int(build_prompt(prompt, episode_id, self.store, self.tokenizer, stop_ids).size)

    def check(self, episode_id: str, prompt: PromptSpec, sampling: SamplingConfig) -> int:
        """The prompt's length; ContextLengthExceededError when not even one token fits after it."""
        n = self.prompt_len(episode_id, prompt, sampling)
        self.refuse(n, prompt)
        return n

    def refuse(self, n: int, prompt: PromptSpec) -> None:
        """ContextLengthExceededError when a prompt of `n` tokens leaves no room for one generated token."""
        if n >= self.max_model_len:
            where = "continuing its context" if prompt.parent_call_id else "rendered"
            raise ContextLengthExceededError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"messages resulted in {n} tokens ({where}), which leaves no room for a completion. "
                "Please reduce the length of the messages (compact the history)",
                param="messages",
            )
