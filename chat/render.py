"""Chat request -> prompt token ids, reusing the exact tokens of the context's selected predecessor.

A chat harness sends the whole conversation each time. Re-rendering it would re-tokenize what the
model generated, and re-tokenized text is not always the sampled tokens; so when a request *extends*
the predecessor call, the prompt is spliced instead (docs/design.md section 4):

    prompt = predecessor.prompt_ids + predecessor.completion_ids + suffix_ids

It is an extension iff request.messages == predecessor.messages + [the predecessor's response]
+ only new user/tool/system messages (and the tools are unchanged), compared *semantically*: JSON tool-call
arguments are compared parsed (OpenCode re-serialises them as compact JSON), content null/""/[] are
equal, a list of text parts equals their concatenation, keys with null values are absent. Tool-call
ids are compared only where both sides have one (they are never rendered into tokens). Values are
compared *type-strictly* (`typed`): Python's `True == 1 == 1.0` would accept a history in which the
model's `true` became `1` or its `10` became `10.0`, which is not what the model saw; JSON's
booleans, integers and floats are distinct values here (a harness that re-serialises `10.0` as `10`,
as JavaScript does, gets a 400 naming the argument rather than a silently different history).

The suffix is what the template renders after the predecessor's completion:
- the rest of the assistant turn's closing text (e.g. "\n" after "<|im_end|>"; found by rendering
  a sentinel assistant message), minus what the completion's final end-of-turn token already holds;
- then render(all messages, generation prompt)[len(render(messages up to the response)):].
That is exact only for a template that is prefix-stable at this boundary; it is verified on every
call and a template that is not raises `TemplateNotPrefixStableError` rather than splicing wrongly.

A request that is not an extension is a rewrite (new root, fresh render) when declared; otherwise
`UndeclaredDiscontinuityError` names the first differing message index and field.

Pure module: no I/O. `tokenizer` is a Hugging Face tokenizer with a chat template.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from chat.content_tokens import ControlTextError, Shield
from chat.content_tokens import encode as encode_text
from chat.toolcalls import ParsedAssistant, parse_tool_calls

# What a continuation may add after the predecessor's response: input the policy reads, never an assistant
# turn it did not sample. `system` among them: Claude Code appends per-turn system entries (settings,
# reminders) between turns; refused, its episode ended with a 400 and counted as the policy's failure.
NEW_MESSAGE_ROLES = frozenset({"user", "tool", "system"})
_SENTINEL = "\x00grove-sentinel\x00"


class ChatRenderError(Exception):
    """Base of chat rendering errors."""


class NoChatTemplateError(ChatRenderError, ValueError):
    """The tokenizer has no chat template."""


class UndeclaredDiscontinuityError(ChatRenderError):
    """The request does not extend its predecessor and no rewrite was declared."""

    def __init__(self, message: str, *, index: int | None, field: str) -> None:
        super().__init__(message)
        self.index = index  # first differing message index (None: the tools differ)
        self.field = field

    def __reduce__(self):  # picklable with its fields: the gateway builds prompts in worker processes
        return _discontinuity_of, (type(self), str(self), self.index, self.field)


def _discontinuity_of(cls: type, message: str, index: int | None, field: str) -> UndeclaredDiscontinuityError:
    return cls(message, index=index, field=field)


class TemplateNotPrefixStableError(ChatRenderError):
    """The chat template renders earlier messages differently once later ones are added."""


class ChatTemplateError(ChatRenderError):
    """The chat template refused the messages (raise_exception, a missing field, ...) (HTTP 400)."""


@dataclass(frozen=True)
class Predecessor:
    """The context's selected predecessor call: what it was asked and exactly what it produced."""

    messages: Sequence[dict[str, Any]]
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    tools: Sequence[dict[str, Any]] | None = None
    # The assistant message the gateway returned for it; derived from completion_ids when absent.
    response: dict[str, Any] | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    prompt_ids: list[int]
    continuation: bool  # True: prompt = predecessor prompt + completion + suffix_ids
    suffix_ids: list[int] | None = None  # continuation only
    rewrite: bool = False  # a declared rewrite replaced the predecessor (new root)


# ---- semantic comparison ------------------------------------------------------------------------


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments  # not JSON: compare the text itself
    return arguments


def _canonical_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(p.get("text", "") for p in content)
    return content


def _canonical_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", {})
    out = {k: v for k, v in call.items() if k not in ("function", "id") and v is not None}
    out.setdefault("type", "function")  # the only type there is; some clients omit it
    out["function"] = {
        **{k: v for k, v in fn.items() if v is not None},
        "arguments": _canonical_arguments(fn.get("arguments", {})),
    }
    return out


def canonical_message(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a message that matter, in a form where semantic equality is `==`."""
    out = {k: v for k, v in message.items() if v is not None and k not in ("content", "tool_calls")}
    out["content"] = _canonical_content(message.get("content"))
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [_canonical_tool_call(c) for c in calls]
    return out


def typed(value: Any) -> Any:
    """`value` (parsed JSON) in a form whose `==` is type-strict: booleans, integers and floats are
    tagged with their type (Python's `True == 1 == 1.0`), floats by their repr (so NaN equals NaN)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", repr(value))
    return value


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages are semantically equal (canonical forms, type-strict); tool-call ids are
    not compared (see first_difference for where they are)."""
    return typed(canonical_message(a)) == typed(canonical_message(b))


def same_tools(a: Any, b: Any) -> bool:
    """Whether two tool lists are equal as JSON values, type-strictly."""
    return typed(_canonical_tools(a)) == typed(_canonical_tools(b))


def _ids_differ(got: dict[str, Any], expected: dict[str, Any]) -> int | None:
    """Index of the first tool call whose ids are both present and differ."""
    for i, (g, e) in enumerate(
        zip(got.get("tool_calls") or [], expected.get("tool_calls") or [], strict=False)
    ):
        if g.get("id") and e.get("id") and g["id"] != e["id"]:
            return i
    return None


def first_difference(got: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Name of the first field where two messages differ semantically, else None."""
    a, b = canonical_message(got), canonical_message(expected)
    for key in (
        "role",
        "content",
        "tool_calls",
        *sorted((set(a) | set(b)) - {"role", "content", "tool_calls"}),
    ):
        if typed(a.get(key)) != typed(b.get(key)):
            return key
    i = _ids_differ(got, expected)
    return None if i is None else f"tool_calls[{i}].id"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _discontinuity(index: int | None, field: str, detail: str) -> UndeclaredDiscontinuityError:
    where = "the tools" if index is None else f"message {index}"
    return UndeclaredDiscontinuityError(
        f"the request does not extend its context's selected predecessor: {where} differs in {field!r} "
        f"({detail}). A continuation must repeat the predecessor's messages and response unchanged and add "
        "only user/tool/system messages; if the harness rewrote the history (compaction, edit), declare a "
        "rewrite",
        index=index,
        field=field,
    )


def check_extension(
    messages: Sequence[dict[str, Any]], tools: Any, pred: Predecessor, response: dict
) -> None:
    """Raise UndeclaredDiscontinuityError unless `messages` = pred.messages + response + new input messages
    (user/tool/system)."""
    if not same_tools(tools, pred.tools):
        raise _discontinuity(None, "tools", "the tool list changed")
    expected = [*pred.messages, response]
    for i, want in enumerate(expected):
        if i >= len(messages):
            detail = f"the request has {len(messages)} messages, expected at least {len(expected)}"
            raise _discontinuity(i, "role", detail)
        field = first_difference(messages[i], want)
        if field is not None:
            key = field.split("[")[0]
            exp, got = canonical_message(want).get(key), canonical_message(messages[i]).get(key)
            raise _discontinuity(i, field, f"expected {_short(exp)}, got {_short(got)}")
    for i in range(len(expected), len(messages)):
        role = messages[i].get("role")
        if role not in NEW_MESSAGE_ROLES:
            detail = f"a new {role!r} message; only user/tool/system messages may be added"
            raise _discontinuity(i, "role", detail)


def _canonical_tools(tools: Any) -> Any:
    return json.loads(json.dumps(tools or [], sort_keys=True))


# ---- rendering ----------------------------------------------------------------------------------


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: tool-call arguments as objects, not JSON strings (HF
    templates such as Qwen2.5's apply `tojson` to them; vLLM's server converts the same way)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                if isinstance(c.get("function"), dict):
                    fn = dict(c["function"])
                    args = _canonical_arguments(fn.get("arguments", {}))
                    fn["arguments"] = args if isinstance(args, dict) else fn.get("arguments")
                    c["function"] = fn
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def render_text(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, *, generation_prompt: bool
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; chat requests need "
            "a model folder with chat_template.jinja (or use the token-in completions path)"
        )
    try:
        return tokenizer.apply_chat_template(
            template_messages(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
    except (jinja2.TemplateError, TypeError) as err:  # TypeError: e.g. `'text' + none` in a template
        raise ChatTemplateError(
            f"the model's chat template cannot render these messages: {err}; send what the template "
            "supports (e.g. string content)"
        ) from None


def encode(tokenizer: Any, text: str, shield: Shield | None = None) -> list[int]:
    """Ids of rendered text: added tokens only where the template wrote them, content as plain text
    (chat/content_tokens.py). The template writes every special token itself (BOS included)."""
    return encode_text(tokenizer, text, shield)


def shielded_render(
    tokenizer: Any, shield: Shield, messages: Sequence[dict[str, Any]], tools: Any, *, generation_prompt: bool
) -> str:
    """The template's text for the request with its added-token strings hidden (see content_tokens);
    refuses a template that reads them (its shielded text would differ from the real one)."""
    text = render_text(
        tokenizer, shield.hide(list(messages)), shield.hide(tools), generation_prompt=generation_prompt
    )
    if shield.active and shield.restore(text) != render_text(
        tokenizer, messages, tools, generation_prompt=generation_prompt
    ):
        raise ControlTextError(
            f"the request's text contains control-token strings ({sorted(shield.placeholders)}) that the "
            "chat template interprets, so they cannot be encoded as plain text; remove them"
        )
    return text


def render_root(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any = None) -> list[int]:
    """Prompt ids of a fresh render (a context start or a declared rewrite)."""
    shield = Shield.of(tokenizer, messages, tools)
    return encode(
        tokenizer, shielded_render(tokenizer, shield, messages, tools, generation_prompt=True), shield
    )


def _turn_parts(
    tokenizer: Any, prefix: Sequence[dict[str, Any]], tools: Any, shield: Shield | None = None
) -> tuple[str, str]:
    """(opening, closing) text the template puts around an assistant turn's body after `prefix`."""
    sentinel = [*prefix, {"role": "assistant", "content": _SENTINEL}]
    if shield is None:
        text = render_text(tokenizer, sentinel, tools, generation_prompt=False)
    else:
        text = shielded_render(tokenizer, shield, sentinel, tools, generation_prompt=False)
    # The last occurrence: earlier messages may hold the sentinel's text themselves (a user can send it).
    at = text.rfind(_SENTINEL)
    if at < 0:
        raise TemplateNotPrefixStableError("the chat template does not render assistant content verbatim")
    return text[:at], text[at + len(_SENTINEL) :]


def _atomic_text(tokenizer: Any, token_id: int) -> str | None:
    """Text of an added (atomic) token such as <|im_end|>, else None."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tok = added.get(int(token_id))
    return None if tok is None else str(tok)


def assistant_turn_text(tokenizer: Any, message: dict[str, Any], tools: Any = None) -> str:
    """The body text the template renders for an assistant message (no opening, no closing)."""
    prefix = [{"role": "user", "content": "x"}]
    opening, closing = _turn_parts(tokenizer, prefix, tools)
    full = render_text(tokenizer, [*prefix, message], tools, generation_prompt=False)
    if not (full.startswith(opening) and full.endswith(closing)):
        raise TemplateNotPrefixStableError(
            "the chat template opens or closes an assistant turn with tool calls differently from one with "
            "content only; its tool-call text cannot be isolated"
        )
    return full[len(opening) : len(full) - len(closing)]


def _ends_turn(tokenizer: Any, token_id: int, closing: str) -> bool:
    """Whether `token_id` is an atomic token that starts the template's turn closing (e.g. <|im_end|>)."""
    last = _atomic_text(tokenizer, token_id)
    return bool(last and closing.startswith(last))


def response_of(
    tokenizer: Any,
    completion_ids: Sequence[int],
    stop_ids: Sequence[int] = (),
    closing: str = "",
    tool_parser: Any = None,
) -> ParsedAssistant:
    """The assistant message the gateway returns for a completion: text without the final stop token
    (a stop id, the tokenizer's EOS, or the token that starts the template's turn `closing`), tool
    calls parsed by `tool_parser` (chat/tool_parsers.py; default grove's hermes parser; malformed
    tool-call text stays content)."""
    ids = list(completion_ids)
    stops = {*stop_ids, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])}
    if ids and (ids[-1] in stops or _ends_turn(tokenizer, ids[-1], closing)):
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return parse_tool_calls(text) if tool_parser is None else tool_parser.parse(text)


def _splice_suffix(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, pred: Predecessor
) -> list[int]:
    k = len(pred.messages)
    shield = Shield.of(tokenizer, messages, tools)
    upto = shielded_render(tokenizer, shield, messages[: k + 1], tools, generation_prompt=False)
    full = shielded_render(tokenizer, shield, messages, tools, generation_prompt=True)
    before = shielded_render(tokenizer, shield, messages[:k], tools, generation_prompt=True)
    opening, closing = _turn_parts(tokenizer, messages[:k], tools, shield)
    if not full.startswith(upto) or opening != before or not upto.endswith(closing):
        raise TemplateNotPrefixStableError(
            f"the chat template is not prefix-stable at message {k} (the predecessor's response): rendering "
            "later messages changes the text of earlier ones, so the predecessor's exact tokens cannot be "
            "reused; use a prefix-stable template or declare a rewrite"
        )
    covered = ""
    if pred.completion_ids and _ends_turn(tokenizer, pred.completion_ids[-1], closing):
        # The sampled end-of-turn token already is the start of the closing text.
        covered = _atomic_text(tokenizer, pred.completion_ids[-1]) or ""
    return encode(tokenizer, closing[len(covered) :] + full[len(upto) :], shield)


def render_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Any = None,
    predecessor: Predecessor | None = None,
    *,
    declared_rewrite: bool = False,
    stop_ids: Sequence[int] = (),
    tool_parser: Any = None,
) -> RenderedPrompt:
    """Prompt ids for a chat request; a continuation of `predecessor` when the messages extend it."""
    if predecessor is None or declared_rewrite:
        return RenderedPrompt(render_root(tokenizer, messages, tools), False, None, predecessor is not None)
    response = predecessor.response
    if response is None:
        # Derived: the gateway made its tool-call ids up, so ids are not compared.
        _, closing = _turn_parts(tokenizer, predecessor.messages, tools)
        parsed = response_of(tokenizer, predecessor.completion_ids, stop_ids, closing, tool_parser)
        response = parsed.message(with_ids=False)
    check_extension(messages, tools, predecessor, response)
    suffix = _splice_suffix(tokenizer, messages, tools, predecessor)
    prompt = [*predecessor.prompt_ids, *predecessor.completion_ids, *suffix]
    return RenderedPrompt([int(t) for t in prompt], True, suffix)
