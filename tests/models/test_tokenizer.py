"""The tiny model's byte-level BPE: fixed special ids, all bytes covered, lossless round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.corpus import generate_corpus
from models.tokenizer import TokenizerTrainingError, train_tokenizer

# Written by hand from the layout the builder promises: control tokens first, tool tags last.
EXPECTED_ADDED_IDS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 2044,
    "</tool_call>": 2045,
    "<tool_response>": 2046,
    "</tool_response>": 2047,
}


def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """Independent reference: GPT-2's published byte -> printable-character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_OF_CHAR = {c: b for b, c in _gpt2_bytes_to_unicode().items()}


def _token_bytes(tokenizer, ids: list[int]) -> bytes:
    """Reassemble the raw bytes from the tokens' byte-level symbols, without the tokenizer's decoder."""
    return b"".join(bytes(BYTE_OF_CHAR[c] for c in tokenizer.convert_ids_to_tokens(i)) for i in ids)


def test_vocab_has_2048_ids_and_fixed_added_token_ids(tiny_tokenizer):
    assert len(tiny_tokenizer) == 2048
    for token, expected_id in EXPECTED_ADDED_IDS.items():
        assert tiny_tokenizer.convert_tokens_to_ids(token) == expected_id, token
    assert tiny_tokenizer.eos_token == "<|endoftext|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.unk_token is None


def test_every_byte_has_a_token(tiny_tokenizer):
    vocab = tiny_tokenizer.get_vocab()
    missing = [b for b, c in _gpt2_bytes_to_unicode().items() if c not in vocab]
    assert missing == []


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_unicode_round_trip_is_lossless(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < 2048 for i in ids)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text
    if not any(t in text for t in EXPECTED_ADDED_IDS):  # added tokens are not byte-level symbols
        assert _token_bytes(tiny_tokenizer, ids) == text.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_latin1_round_trip(tiny_tokenizer, data):
    text = data.decode("latin-1")  # every byte value as one code point U+0000..U+00FF
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text
    assert _token_bytes(tiny_tokenizer, ids) == text.encode("utf-8")


def test_special_tokens_are_atomic_and_control_tokens_are_skippable(tiny_tokenizer):
    text = '<|im_start|>assistant\n<tool_call>{"a": 1}</tool_call><|im_end|><|endoftext|>'
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids[-2:] == [2, 0] and 2044 in ids and 2045 in ids
    # Control tokens disappear; tool tags stay so a hermes parser sees them in decoded text.
    assert (
        tiny_tokenizer.decode(ids, skip_special_tokens=True) == 'assistant\n<tool_call>{"a": 1}</tool_call>'
    )


def test_digits_are_split_one_by_one(tiny_tokenizer):
    tokens = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer.encode("x 2025", add_special_tokens=False))
    assert tokens[-4:] == ["2", "0", "2", "5"]


def test_training_is_deterministic_and_depends_on_the_seed():
    docs = generate_corpus(0, n_documents=4000)
    first = train_tokenizer(docs, vocab_size=2048).to_str()
    assert train_tokenizer(docs, vocab_size=2048).to_str() == first
    other = train_tokenizer(generate_corpus(1, n_documents=4000), vocab_size=2048).to_str()
    assert other != first


def test_too_small_corpus_is_a_named_error():
    with pytest.raises(TokenizerTrainingError, match="expected exactly 2048"):
        train_tokenizer(generate_corpus(0, n_documents=20), vocab_size=2048)
