"""Text never becomes control tokens unless the chat template put it there.

A tokenizer matches its *added tokens* (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, the tiny model's
`<tool_call>` tags, SmolLM2's `<file_sep>`...) anywhere in the text it is given, before BPE. Tokenizing a
rendered chat as one string therefore turns a user's or a tool's literal `<|im_start|>assistant` into
the real control tokens: a forged assistant turn in the prompt. HF's `split_special_tokens=True` is not
enough: it still matches added tokens that are not "special" (the tiny model's tool tags).

How grove encodes a chat instead:

1. `Shield.of(tokenizer, messages, tools)` finds the added-token strings that occur in the request's
   own strings (content, tool-call names and arguments, tool schemas, keys included) and replaces each
   by a placeholder (`GROVECTL<n>X<i>Z`, ASCII letters and digits, so JSON escaping and templates keep
   it verbatim; `<n>` is chosen so that no request string and not the template contain it).
2. The template renders the shielded messages: every added-token string left in the text is the
   template's own.
3. `encode(tokenizer, text, shield)` splits the text at those (leftmost-longest, as the tokenizer
   does), encodes each piece between them *without* the added vocabulary (normalizer, pre-tokenizer,
   BPE model: the exact pipeline the tokenizer runs on text between added tokens) after putting the
   original strings back, and puts each template marker's id between the pieces.

For text without added-token strings this is token for token what `tokenizer(text)` gives (tested
on both chat templates in the repo), so prompts, splices and pretraining text are unchanged; content
that contains them is encoded as the plain characters it is (`<|im_start|>` -> `<|`, `im`, `_`, ...).
A template that *reads* content (e.g. splits it on a marker) would render the shielded request
differently: that is detected (the restored shielded render must equal the real one) and refused
with `ControlTextError`, never tokenized the unsafe way.

Other control characters (NUL, ESC, ...) are ordinary text: byte-level BPE encodes every byte, and
harness tool outputs (terminal colours, binary files) contain them legitimately; the gateway keeps them.

Pure module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class ContentTokenError(Exception):
    """Base of the errors of this module."""


class ControlTextError(ContentTokenError):
    """The request's text holds control-token strings that the chat template interprets (HTTP 400)."""


class UnsupportedTokenizerError(ContentTokenError):
    """A tokenizer whose added tokens strip whitespace or match inside words: its added-token splitting
    cannot be reproduced piece by piece."""


@dataclass(frozen=True)
class Markers:
    """The tokenizer's added tokens: their text -> id, and a leftmost-longest pattern over them."""

    ids: dict[str, int]
    pattern: re.Pattern[str] | None

    @classmethod
    def of(cls, tokenizer: Any) -> Markers:
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        ids: dict[str, int] = {}
        for token_id, tok in added.items():
            if any(getattr(tok, flag, False) for flag in ("lstrip", "rstrip", "single_word")):
                raise UnsupportedTokenizerError(
                    f"added token {str(tok)!r} (id {token_id}) strips whitespace or matches whole words "
                    "only; grove's chat encoding splits text at added tokens exactly and cannot reproduce it"
                )
            ids[str(tok)] = int(token_id)
        if not ids:
            return cls({}, None)
        alternatives = sorted(ids, key=len, reverse=True)  # longest first: leftmost-longest matching
        return cls(ids, re.compile("|".join(re.escape(m) for m in alternatives)))


def strings_of(value: Any) -> Iterator[str]:
    """Every string in a JSON-like value, dict keys included (iterative)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str):
                    yield k
                stack.append(v)
        elif isinstance(item, list | tuple):
            stack.extend(item)


@dataclass(frozen=True)
class Shield:
    """Placeholders for the added-token strings of one request (empty when it has none)."""

    markers: Markers
    placeholders: dict[str, str] = field(default_factory=dict)  # marker text -> placeholder
    restore_pattern: re.Pattern[str] | None = None

    @property
    def active(self) -> bool:
        return bool(self.placeholders)

    @classmethod
    def of(cls, tokenizer: Any, *values: Any) -> Shield:
        markers = Markers.of(tokenizer)
        if markers.pattern is None:
            return cls(markers)
        strings = [s for v in values for s in strings_of(v)]
        present = sorted({m.group() for s in strings for m in markers.pattern.finditer(s)})
        if not present:
            return cls(markers)
        corpus = [*strings, str(getattr(tokenizer, "chat_template", "") or "")]
        n = 0
        while any(f"GROVECTL{n}X" in s for s in corpus):
            n += 1
        placeholders = {m: f"GROVECTL{n}X{i}Z" for i, m in enumerate(present)}
        return cls(markers, placeholders, re.compile(f"GROVECTL{n}X([0-9]+)Z"))

    def hide(self, value: Any) -> Any:
        """`value` with every added-token string inside its strings replaced by its placeholder."""
        pattern = self.markers.pattern
        if not self.active or pattern is None:  # no added tokens: no string can hold a marker
            return value
        if isinstance(value, str):
            return pattern.sub(lambda m: self.placeholders[m.group()], value)
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.hide(v) for v in value]
        return value

    def restore(self, text: str) -> str:
        if not self.active or self.restore_pattern is None:  # nothing was hidden
            return text
        by_index = list(self.placeholders)
        return self.restore_pattern.sub(lambda m: by_index[int(m.group(1))], text)


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` encoded as text: normalizer, pre-tokenizer and BPE model, no added-token matching."""
    if not text:
        return []
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
    return [tok.id for piece, _ in pieces for tok in backend.model.tokenize(piece)]


def encode(tokenizer: Any, text: str, shield: Shield | None = None) -> list[int]:
    """Ids of rendered chat text: an added token where the (shielded) text has its string, which only
    the template can have written; everything else, content restored, as plain text."""
    shield = shield or Shield(Markers.of(tokenizer))
    markers = shield.markers
    control = frozenset(markers.ids.values())

    def text_ids(piece: str) -> list[int]:
        out = plain_ids(tokenizer, shield.restore(piece))
        if control.intersection(out):  # a BPE vocabulary that merges text into a marker: fail closed
            raise ControlTextError(
                f"the tokenizer's model encodes the text {piece[:60]!r} into an added (control) token; "
                "grove cannot encode it as plain text"
            )
        return out

    if markers.pattern is None:
        return text_ids(text)
    ids: list[int] = []
    at = 0
    for m in markers.pattern.finditer(text):
        ids += text_ids(text[at : m.start()])
        ids.append(markers.ids[m.group()])
        at = m.end()
    ids += text_ids(text[at:])
    return ids
