"""The prompt-length lower bound (gateway/intake/tokenization.py `PromptBound`): it never exceeds the exact
length, refuses what cannot fit without tokenizing it, and is off where it would not hold.

The tiny model's real tokenizer and chat template; exact lengths from the gateway's own prompt builder
(the one the generate activity runs), over seeded random texts of every character class a harness may
send (control characters, combining marks, CJK, emoji, the template's own marker strings).
"""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gateway.intake.context_window import ContextLengthExceededError, ContextWindow
from gateway.intake.tokenization import PromptBound
from grove.contracts import ChatPrompt, PromptSpec
from grove.sampling import SamplingConfig
from storage.local import LocalStore

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz ",
    "0123456789",
    " \n\t  \n\n",
    "\x00\x01\x1b[0m\x7f",
    "e\u0301a\u0308o\u0302",  # combining marks
    "漢字かなカナ한국어",
    "😀🚀👩‍💻🇳🇴",
    "<|im_start|><|im_end|><|endoftext|><tool_call>",
    '{}[]":,\\/',
]


def text(rng: random.Random, n: int) -> str:
    pieces = [rng.choice(rng.choice(ALPHABETS)) for _ in range(n)]
    return "".join(pieces)


@pytest.fixture(scope="module")
def window(tiny_model_dir, tmp_path_factory) -> ContextWindow:
    return ContextWindow.load(str(tiny_model_dir), 1024, LocalStore(tmp_path_factory.mktemp("store")))


def test_the_bound_is_on_for_the_tiny_model_and_counts_the_verbatim_roles(window):
    bound = PromptBound.of(window.tokenizer)
    assert bound is not None and bound.roles == {"system", "user", "tool"}
    assert bound.bytes_per_token >= max(len(t) for t in window.tokenizer.get_vocab())


def test_the_lower_bound_never_exceeds_the_exact_prompt_length(window):
    bound = PromptBound.of(window.tokenizer)
    rng = random.Random(33)
    call = {"id": "c0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}
    for case in range(150):
        n = rng.choice([1, 5, 40, 300])
        messages = [
            {"role": "system", "content": text(rng, n)},
            {"role": "user", "content": text(rng, n)},
            {"role": "assistant", "content": text(rng, n), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": text(rng, n)},
            {"role": "user", "content": text(rng, n)},
        ][: rng.randint(2, 5)]
        exact = window.prompt_len("ep", PromptSpec(chat=ChatPrompt(messages=messages)), SamplingConfig())
        assert bound.tokens_at_least(messages) <= exact, (case, messages)


def test_the_bound_holds_for_text_made_of_the_widest_tokens(window):
    """Where the bound is tightest: text that is the vocabulary's longest tokens, over and over."""
    bound = PromptBound.of(window.tokenizer)
    vocab = window.tokenizer.get_vocab()
    widest = sorted(vocab, key=len)[-20:]
    for piece in widest:
        content = window.tokenizer.convert_tokens_to_string([piece]) * 60
        messages = [{"role": "user", "content": content}]
        exact = window.prompt_len("ep", PromptSpec(chat=ChatPrompt(messages=messages)), SamplingConfig())
        assert 0 < bound.tokens_at_least(messages) <= exact, (piece, exact)


def test_a_prompt_whose_text_cannot_fit_is_refused_by_the_bound(window):
    bound = PromptBound.of(window.tokenizer)
    huge = [{"role": "user", "content": "x" * 3_900_000}]
    with pytest.raises(ContextLengthExceededError) as err:
        bound.check(huge, 1024)
    assert err.value.openai_code == "context_length_exceeded" and "at least" in str(err.value)
    fits = [{"role": "user", "content": "x" * 100}]
    bound.check(fits, 1024)  # a bound under the context is no verdict: the exact count decides


def test_no_bound_for_a_tokenizer_it_would_not_hold_for():
    """WordPiece maps a whole unknown word to one [UNK]: a token may stand for any number of bytes."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    assert PromptBound.of(tok) is None


def test_roles_the_template_does_not_render_verbatim_are_not_counted(window):
    """A template that rewrites system text (here: upper-cases it) must not have it counted."""
    system = "render_content(messages[0].content, 'system')"
    template = window.tokenizer.chat_template.replace(system, f"({system} | upper)")
    assert template != window.tokenizer.chat_template
    tok = window.tokenizer.__class__.from_pretrained(window.tokenizer.name_or_path)
    tok.chat_template = template
    bound = PromptBound.of(tok)
    assert bound is not None and "system" not in bound.roles
