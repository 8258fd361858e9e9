"""The policy engine's errors: one class per way a generation, a publication or an engine can fail."""

from __future__ import annotations

from models.limits import EngineLimitsError


class EngineError(Exception):
    """Base of the policy engine's errors."""


class EmptyPromptError(EngineError, ValueError):
    """A generation was asked for with no prompt tokens."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt leaves no room for one generated token within the engine's max_model_len."""


class TokenIdOutOfRangeError(EngineError, ValueError):
    """A prompt token id is outside the model's vocabulary."""


class GenerationAbortedError(EngineError):
    """vLLM aborted the request (engine shutdown or abort); no completion is reported."""


class EngineOutputError(EngineError):
    """vLLM returned an output that breaks the capture contract (e.g. a logprob count mismatch)."""


class VersionStraddleError(EngineError):
    """A call's tokens were not all sampled under the version it was admitted under."""


class StaleVersionError(EngineError, ValueError):
    """A publication of a version older than the engine's current one."""


class VersionConflictError(EngineError, ValueError):
    """A publication of the current version number with different weights."""


class WeightsMismatchError(EngineError, ValueError):
    """A weights folder does not hold exactly the tensors (names, shapes) of the served model."""


class PublishFailedError(EngineError):
    """The weight reload failed and was rolled back: the engine still serves the previous version."""


class EngineBrokenError(EngineError):
    """A failed reload could not be rolled back; the worker must be restarted."""


class EngineDiedError(EngineError):
    """vLLM's engine core died (a crash inside the model step, its process killed). Unrecoverable in
    this process: the call is retryable elsewhere, and the worker exits (cli/worker.py) so Temporal
    sends its calls to a live worker instead of to an engine that answers every call with an error."""


class NonFiniteLogprobError(EngineError):
    """The engine returned a NaN or infinite behaviour logprob (non-finite logits: corrupt or diverged
    weights). The call fails here, at generation, instead of poisoning a training step later."""


class StepBudgetTooSmallError(EngineLimitsError):
    """max_num_batched_tokens < max_model_len on CPU, where prompts are never split over steps."""


class KVCacheTooSmallError(EngineLimitsError):
    """The KV cache cannot hold one context of max_model_len tokens."""
