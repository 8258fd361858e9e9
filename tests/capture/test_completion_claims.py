"""Claim-checked completions (capture/claims.py, grove/contracts/generation.py): a completion above the inline
limit travels as a reference to a `Completion` in the object store, read back verified. Pure parts on a
real LocalStore; the path through Temporal, the gateway and vLLM is
tests/gateway/test_completion_claim_e2e.py."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from capture.claims import (
    CompletionDigestError,
    CompletionMissingError,
    by_reference,
    completion_of,
    inline_size,
    load_completion,
    stash_completion,
)
from grove.contracts import CallResult, Completion, GenerateResult, ObjectRef
from grove.receipts import TokenDigests
from grove.store_layout import staging_prefix
from storage.base import DigestMismatchError, ObjectNotFoundError, StorageError
from storage.local import LocalStore

EPISODE = "run/s000001/t0/g0"
COMPLETION = Completion(
    text="Hello, wörld.", assistant_message={"role": "assistant", "content": "Hello, wörld."}
)
DIGESTS = TokenDigests(
    prompt_len=3,
    completion_len=4,
    prompt_sha256="a" * 64,
    completion_sha256="b" * 64,
    logprobs_sha256="c" * 64,
)
RECEIPT = {"call_id": "parent.0.c0", "finish_reason": "length", "policy_version": 0, "digests": DIGESTS}


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path)


def test_a_stashed_completion_reads_back_verified_from_the_episodes_staging(store):
    ref = stash_completion(store, EPISODE, "parent.0.c0", COMPLETION)
    assert ref.key.startswith(staging_prefix(EPISODE)) and "parent.0.c0" in ref.key
    assert ref.size == len(store.get(ref.key))
    assert load_completion(store, EPISODE, ref) == COMPLETION
    # Deterministic key and bytes: a re-run of the activity verifies its own object and names it again.
    assert stash_completion(store, EPISODE, "parent.0.c0", COMPLETION) == ref
    # Deleted with the episode's staging (clean_staging deletes that prefix).
    assert store.list(staging_prefix(EPISODE)) == [ref.key]


def test_a_missing_completion_is_a_typed_storage_error_naming_the_key(store):
    ref = stash_completion(store, EPISODE, "parent.0.c0", COMPLETION)
    store.delete(ref.key)
    with pytest.raises(CompletionMissingError) as err:
        load_completion(store, EPISODE, ref)
    # An ObjectNotFoundError and a StorageError: handled like every other missing object (HTTP 503 at the
    # gateway, a named non-retryable failure in an IO activity).
    assert isinstance(err.value, ObjectNotFoundError) and isinstance(err.value, StorageError)
    assert ref.key in str(err.value) and EPISODE in str(err.value) and "retry" in str(err.value)


def test_changed_bytes_under_the_key_are_refused(store):
    ref = stash_completion(store, EPISODE, "parent.0.c0", COMPLETION)
    other = Completion(
        text="Hello, world!", assistant_message={"role": "assistant", "content": "Hello, world!"}
    )
    store.put(ref.key, other.model_dump_json().encode())  # same size, other bytes
    with pytest.raises(CompletionDigestError) as err:
        load_completion(store, EPISODE, ref)
    assert isinstance(err.value, DigestMismatchError) and ref.key in str(err.value)
    store.put(ref.key, store.get(ref.key) + b" ")  # other size
    with pytest.raises(CompletionDigestError):
        load_completion(store, EPISODE, ref)


def test_a_reference_outside_the_episodes_staging_is_refused(store):
    ref = stash_completion(store, "other/s000001/t0/g0", "parent.0.c0", COMPLETION)
    with pytest.raises(CompletionDigestError) as err:
        load_completion(store, EPISODE, ref)
    assert "outside" in str(err.value) and staging_prefix(EPISODE) in str(err.value)


def test_the_inline_limit_counts_the_bytes_the_completion_adds_to_a_payload():
    ids = list(range(100, 140))
    inline = GenerateResult(**RECEIPT, staging_key="k", completion_ids=ids, **COMPLETION.model_dump())
    bare = GenerateResult(
        **RECEIPT, staging_key="k", completion_ids=[], text="", assistant_message={}
    ).model_dump_json()
    # what the three fields' values add to the JSON payload beyond their empty forms
    added = len(inline.model_dump_json().encode()) - len(bare.encode())
    size = inline_size(ids, COMPLETION)
    # the same bytes, plus the Completion object's keys and the empty values' quotes and brackets
    assert 0 <= size - added <= len('{"text":"","assistant_message":{}}[]'), (size, added)
    assert not by_reference(ids, COMPLETION, size) and by_reference(ids, COMPLETION, size - 1)
    assert not by_reference(ids * 1000, COMPLETION, None)  # None: callers before it, always inline


def test_a_result_carries_its_completion_inline_or_by_reference_never_both_or_neither(store):
    ref = ObjectRef(key=f"{staging_prefix(EPISODE)}completions/x.json", sha256="d" * 64, size=10)
    with pytest.raises(ValidationError, match="inline or by reference"):
        CallResult(**RECEIPT, staging_key="k", completion_ref=ref, **COMPLETION.model_dump())
    with pytest.raises(ValidationError, match="text and assistant_message"):
        CallResult(**RECEIPT, staging_key="k", completion_ids=[1, 2])
    by_ref = CallResult(**RECEIPT, staging_key="k", completion_ref=ref)
    assert by_ref.inline_completion() is None and by_ref.text is None and by_ref.completion_ids is None


def test_results_recorded_before_references_still_validate():
    # a GenerateResult / CallResult as histories recorded without references hold them (all inline)
    recorded = {**RECEIPT, "digests": DIGESTS.model_dump(), "staging_key": "k", "completion_ids": [5, 6]}
    recorded |= {"text": "hi", "assistant_message": {"role": "assistant", "content": "hi"}}
    for model in (GenerateResult, CallResult):
        result = model.model_validate_json(json.dumps(recorded))
        assert result.inline_completion() == Completion(
            text="hi", assistant_message=recorded["assistant_message"]
        )


def test_completion_of_reads_the_store_only_for_a_reference(store):
    inline = CallResult(**RECEIPT, staging_key="k", completion_ids=[1], **COMPLETION.model_dump())
    assert completion_of(store, EPISODE, inline) == COMPLETION  # nothing stored: not read
    ref = stash_completion(store, EPISODE, "parent.0.c0", COMPLETION)
    assert (
        completion_of(store, EPISODE, CallResult(**RECEIPT, staging_key="k", completion_ref=ref))
        == COMPLETION
    )
