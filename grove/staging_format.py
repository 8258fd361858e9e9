"""The staged form of one call's token arrays: deterministic safetensors bytes (pure, no I/O).

The generation activity writes one object per call at `staging_key(episode_id, call_id)`
(grove/store_layout.py); the reconstruction reads it back and verifies it against the call's receipt
digests. Digests are sha256 of the raw little-endian arrays (int32 ids, float32 logprobs), so they do not
depend on the container.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from grove.receipts import TokenDigests

_FIELDS = ("prompt_ids", "completion_ids", "logprobs")


class StagedObjectError(ValueError):
    """A staged object is not a valid call-token container (missing array, wrong dtype or length)."""


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@dataclass(frozen=True)
class CallTokens:
    """A call's exact tokens: prompt ids, sampled ids and the sampled tokens' behaviour logprobs."""

    prompt_ids: np.ndarray  # int32 [P]
    completion_ids: np.ndarray  # int32 [C]
    logprobs: np.ndarray  # float32 [C]

    @staticmethod
    def of(prompt_ids, completion_ids, logprobs) -> CallTokens:
        tokens = CallTokens(
            np.asarray(prompt_ids, dtype="<i4"),
            np.asarray(completion_ids, dtype="<i4"),
            np.asarray(logprobs, dtype="<f4"),
        )
        if tokens.completion_ids.shape != tokens.logprobs.shape:
            raise StagedObjectError(
                f"completion has {tokens.completion_ids.size} ids but {tokens.logprobs.size} logprobs; "
                "the engine must return exactly one logprob per sampled token"
            )
        return tokens

    def digests(self) -> TokenDigests:
        return TokenDigests(
            prompt_len=int(self.prompt_ids.size),
            completion_len=int(self.completion_ids.size),
            prompt_sha256=_sha(self.prompt_ids),
            completion_sha256=_sha(self.completion_ids),
            logprobs_sha256=_sha(self.logprobs),
        )


def encode_call_tokens(tokens: CallTokens) -> bytes:
    """Deterministic bytes (safetensors; same arrays -> same bytes)."""
    return st_save(
        {
            "prompt_ids": np.ascontiguousarray(tokens.prompt_ids, dtype="<i4"),
            "completion_ids": np.ascontiguousarray(tokens.completion_ids, dtype="<i4"),
            "logprobs": np.ascontiguousarray(tokens.logprobs, dtype="<f4"),
        }
    )


def decode_call_tokens(data: bytes, *, key: str = "<bytes>") -> CallTokens:
    try:
        arrays = st_load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError on malformed headers
        raise StagedObjectError(f"staged object {key} is not a safetensors container: {exc}") from exc
    missing = [f for f in _FIELDS if f not in arrays]
    if missing:
        raise StagedObjectError(f"staged object {key} lacks arrays {missing}; expected {list(_FIELDS)}")
    return CallTokens.of(arrays["prompt_ids"], arrays["completion_ids"], arrays["logprobs"])
