"""Sampling parameters of a generation, and which behaviour logprobs they make the engine record.

The engine runs with vLLM `logprobs_mode="processed_logprobs"`: the logprob recorded for a sampled
token is taken from the distribution it was *sampled from*, i.e.

    log_softmax(top_p_mask(logits / temperature))

where `top_p_mask` keeps the smallest set of most likely tokens whose probability reaches `top_p`
(vLLM's rule: sort ascending, mask every token whose cumulative probability is <= 1 - top_p, never
mask the most likely token) and sets the rest to -inf. With top_p == 1 there is no mask. The learner
must compute its new-policy logprobs with the same processing so that the importance ratio
exp(logp_new - logp_behaviour) compares like with like (trainer/logprobs.py mirrors this).

The processing travels with the tokens (docs/design.md section 4): the generate activity records the
`SamplingProcessing` it actually sampled with in the call's receipt (grove/receipts.py), the
reconstruction copies it into every span of the rows (trainer/rows.py), and the learner scores each
token under the processing of its own span. There is no run-wide learner temperature.

Only parameters whose effect on the distribution the learner mirrors are exposed: no top_k, min_p,
penalties, logit bias or min_tokens (each would change the processed distribution in ways the
learner does not reproduce); naming one is `UnmirrorableSamplingError`. Temperature must stay clear
of vLLM's greedy branch (T < 1e-5), where the recorded logprobs silently switch to the untempered
distribution.

Pure module (pydantic only): workflows and the learner import it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

LOGPROBS_MODE = "processed_logprobs"
MIN_TEMPERATURE = 1e-2
# vLLM's SamplingParams refuses temperature > 2 (as OpenAI's API does): a config above it could only
# fail at generation, after admission (a 502 for a request already admitted).
MAX_TEMPERATURE = 2.0
# Past any context an engine of grove serves (an engine stops at its context anyway); larger values reached
# the engine and failed every call with 502.
MAX_TOKENS_LIMIT = 1 << 20
NUMBERS = ("temperature", "top_p", "max_tokens")  # JSON `true` is not a number here (pydantic takes it as 1)

# Engine parameters that reshape the sampled distribution in ways trainer/logprobs.py does not
# reproduce. Naming one (at any value) in a SamplingConfig is refused rather than silently dropped.
UNMIRRORABLE: dict[str, str] = {
    "top_k": "top-k truncation",
    "min_p": "min-p truncation",
    "presence_penalty": "a presence penalty",
    "frequency_penalty": "a frequency penalty",
    "repetition_penalty": "a repetition penalty",
    "logit_bias": "logit bias",
    "allowed_token_ids": "a token allow-list",
    "bad_words": "banned words",
    "min_tokens": "min_tokens (EOS masked for the first tokens)",
    "guided_decoding": "constrained decoding",
    "structured_outputs": "constrained decoding",
}


class UnmirrorableSamplingError(Exception):
    """A sampling parameter the learner cannot mirror (top_k, min_p, penalties, logit bias, ...).

    Not a ValueError on purpose: pydantic re-raises it as itself, so callers can catch it by name.
    """

    def __init__(self, name: str, value: Any, where: str) -> None:
        self.param = name
        super().__init__(
            f"{where}: sampling parameter {name}={value!r} is refused: {UNMIRRORABLE[name]} changes the "
            "distribution the behaviour logprobs come from, and the learner (trainer/logprobs.py) only "
            "mirrors temperature and top_p; drop it and use temperature / top_p instead"
        )


def refuse_unmirrorable(data: Any, where: str) -> None:
    """Raise UnmirrorableSamplingError if the mapping `data` names a parameter in UNMIRRORABLE."""
    if isinstance(data, dict):
        for name in UNMIRRORABLE:
            if name in data:
                raise UnmirrorableSamplingError(name, data[name], where)


def refuse_booleans(data: Any) -> None:
    """ValueError when a number of NUMBERS is given as a boolean."""
    if isinstance(data, dict):
        for name in NUMBERS:
            if isinstance(data.get(name), bool):
                raise ValueError(f"{name}={data[name]!r} is a boolean; give a number")


class SamplingProcessing(BaseModel):
    """What shaped a call's behaviour logprobs: the part of sampling the learner must mirror.

    Recorded per call (receipt) and per span (rows); the learner scores the span's tokens with
    exactly these values. Anything else in SamplingConfig (max_tokens, stop ids, ignore_eos) decides
    *where* generation stops, never the distribution of a sampled token.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    top_p: float = Field(gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _mirrorable(cls, data: Any) -> Any:
        refuse_unmirrorable(data, "SamplingProcessing")
        return data


class SamplingConfig(BaseModel):
    """How one call samples; `processing()` is what the learner needs to recompute the same logprobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(
        default=1.0,
        ge=MIN_TEMPERATURE,
        le=MAX_TEMPERATURE,
        description="softmax temperature the tokens are sampled at",
    )
    top_p: float = Field(
        default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1.0 keeps every token"
    )
    max_tokens: int = Field(
        default=256, ge=1, le=MAX_TOKENS_LIMIT, description="most tokens one call may generate"
    )
    stop_token_ids: tuple[int, ...] = Field(
        default=(), description="extra stop tokens besides the model's EOS"
    )
    ignore_eos: bool = Field(default=False, description="benchmarks: generate exactly max_tokens")

    @model_validator(mode="before")
    @classmethod
    def _mirrorable(cls, data: Any) -> Any:
        refuse_unmirrorable(data, "SamplingConfig")
        refuse_booleans(data)
        return data

    def processing(self) -> SamplingProcessing:
        return SamplingProcessing(temperature=self.temperature, top_p=self.top_p)
