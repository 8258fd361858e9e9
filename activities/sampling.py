"""Sampling parameters of a generation, and which behaviour logprobs they make the engine record.

The engine runs with vLLM `logprobs_mode="processed_logprobs"`: the logprob recorded for a sampled
token is taken from the distribution it was *sampled from*, i.e.

    log_softmax(top_p_mask(logits / temperature))

where `top_p_mask` keeps the smallest set of most likely tokens whose probability reaches `top_p`
(vLLM's rule: sort ascending, mask every token whose cumulative probability is <= 1 - top_p, never
mask the most likely token) and sets the rest to -inf. With top_p == 1 there is no mask. The learner
must compute its new-policy logprobs with the same processing so that the importance ratio
exp(logp_new - logp_behaviour) compares like with like (trainer/logprobs.py mirrors this).

Only parameters whose effect on the distribution the learner mirrors are exposed: no top_k, min_p,
penalties, logit bias or min_tokens (each would change the processed distribution in ways the
learner does not reproduce). Temperature must stay clear of vLLM's greedy branch (T < 1e-5), where
the recorded logprobs silently switch to the untempered distribution.

Pure module (pydantic only): workflows and the learner import it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

LOGPROBS_MODE = "processed_logprobs"
MIN_TEMPERATURE = 1e-2


class SamplingConfig(BaseModel):
    """How one call samples; also what the learner needs to recompute the same logprobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(
        default=1.0, ge=MIN_TEMPERATURE, le=100.0, description="softmax temperature the tokens are sampled at"
    )
    top_p: float = Field(
        default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1.0 keeps every token"
    )
    max_tokens: int = Field(default=256, ge=1, description="most tokens one call may generate")
    stop_token_ids: tuple[int, ...] = Field(
        default=(), description="extra stop tokens besides the model's EOS"
    )
    ignore_eos: bool = Field(default=False, description="benchmarks: generate exactly max_tokens")
