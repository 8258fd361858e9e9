"""Errors for the common identity mistakes of a harness, each naming the header that fixes it.

A request that does not extend its context's head is an undeclared discontinuity (HTTP 400,
chat/render.py). Most of those in practice are one of three wiring mistakes; the gateway then
answers with a subclass that says which, so the error's `code` names the mistake and its message the
header (gateway/pipeline/identity.py):

- `UndeclaredRewriteError`: the request's history holds a summary: the text the agent's latest
  auxiliary call returned (`<agent>~aux` / `<agent>~summary`), or LangChain's
  "Here is a summary of the conversation to date" message, or, with the context's own tools, a message
  from the first differing one on that reads as a summary (it speaks of a summary, a compaction, the
  conversation so far, in its first lines): a history replaced by a summary, whoever wrote it.
  Fix: `x-grove-rewrite: 1`. Checked before the missing headers below: such a request is the agent's own
  compacted history, and an error about identity headers would name the wrong fix.
- `UndeclaredAuxiliaryCallError`: the request looks like a summary/title call: it has no tools where the
  agent's context has them, or (with the context's own tools or none) its last message or its system
  message *asks* for a summary ("Summarize the conversation...", "Write a short summary of...", "You
  are a summarizer"). Fix: `x-grove-call-kind: summary` (or `title`, `auxiliary`). Checked before the
  summary-reading rule below: the request that asks for a summary is not the history the summary
  replaced, and declaring a rewrite on it would retire the agent's context.
- `MissingIdentityHeadersError`: the request has no identity header at all, so it went to the default
  agent "parent", whose context it does not extend, and it looks like another conversation (other
  tools, another first message, or no assistant turn yet): most likely another agent (a worker) sent
  it. Fix: `x-grove-agent` (and `x-grove-spawned-by` for a worker). An edit of the parent's own
  history (same start, assistant turns) stays a plain `UndeclaredDiscontinuityError`.

Each keeps the base class's `index` / `field` (the OpenAI error's `param`). Pure module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from capture.records import ChatRecord
from chat.message_text import text_of
from chat.render import UndeclaredDiscontinuityError, same_tools
from gateway.pipeline.identity import Identity
from grove.headers import AGENT_HEADER, KIND_HEADER, REWRITE_HEADER, SPAWNED_BY_HEADER

# LangChain's SummarizationMiddleware starts the rewritten history with this (langchain 1.x's default prompt)
LANGCHAIN_SUMMARY_PREFIX = "Here is a summary of the conversation to date"
MIN_SUMMARY_CHARS = 16  # shorter auxiliary answers are too common to identify a summary by
# How a summary that replaced a history announces itself, in its first lines (LangChain, OpenCode, Claude
# Code, hand-written compactions alike).
SUMMARY_WORDS = re.compile(
    r"\bsummar(?:y|ies|i[sz]e[sd]?|i[sz]ing)\b|\bcompact(?:ed|ion)?\b|\bconversation (?:so far|to date)\b",
    re.IGNORECASE,
)
SUMMARY_HEAD_CHARS = 400
# What an auxiliary call without its header is told to send (each kind a context of its own)
AUX_KIND_ADVICE = (
    f"`{KIND_HEADER}: summary` for the summary of the agent's context (trained when the run trains "
    f"summaries), `{KIND_HEADER}: title` for a title or `{KIND_HEADER}: auxiliary` for another helper "
    "call (never trained)"
)
# How a summary call asks for one: an imperative at the start of a message, or a summarizer's role.
SUMMARY_ASK = re.compile(
    r"^\W*(?:please[,\s]+)?(?:summari[sz]e\b|compact\b|(?:write|provide|create|give|produce|make|generate)"
    r"\b[^.\n]{0,40}?\bsummar(?:y|ies)\b)|\byou are an? [\w\s-]{0,30}?summari[sz]er\b|\byou summari[sz]e\b"
    r"|\byour (?:task|job) is to summari[sz]e\b",
    re.IGNORECASE,
)


class UndeclaredRewriteError(UndeclaredDiscontinuityError):
    """A rewritten (summarised) history sent without `x-grove-rewrite: 1` (HTTP 400)."""


class UndeclaredAuxiliaryCallError(UndeclaredDiscontinuityError):
    """A summary/title call sent without `x-grove-call-kind: auxiliary` (HTTP 400)."""


class MissingIdentityHeadersError(UndeclaredDiscontinuityError):
    """A request without any identity header that does not extend the parent's context (HTTP 400)."""


def summary_message(
    messages: Sequence[dict[str, Any]], summaries: Sequence[ChatRecord]
) -> tuple[int, str] | None:
    """(index, where it came from) of the first message that carries a summary, else None."""
    texts = [
        (text_of(r.response.get("content")).strip(), r.call_id)
        for r in summaries
        if len(text_of(r.response.get("content")).strip()) >= MIN_SUMMARY_CHARS
    ]
    for i, message in enumerate(messages):
        text = text_of(message.get("content"))
        for summary, call_id in texts:
            if summary in text:
                return i, f"the text auxiliary call {call_id!r} returned"
        if text.lstrip().startswith(LANGCHAIN_SUMMARY_PREFIX):
            return i, f"LangChain's summary message ({LANGCHAIN_SUMMARY_PREFIX!r}...)"
    return None


def _with(cls: type[UndeclaredDiscontinuityError], err: UndeclaredDiscontinuityError, text: str):
    return cls(text, index=err.index, field=err.field)


def rewrite_error(index: int, source: str, err: UndeclaredDiscontinuityError) -> UndeclaredRewriteError:
    return _with(
        UndeclaredRewriteError,
        err,
        f"the request rewrites its agent's history: message {index} holds a summary ({source}) and the "
        f"request does not extend the agent's context ({err}). Send it with the header "
        f"`{REWRITE_HEADER}: 1` (a new context for the agent: the summary starts a new root)",
    )


def diagnose(
    err: UndeclaredDiscontinuityError,
    messages: Sequence[dict[str, Any]],
    tools: Any,
    identity: Identity,
    head: ChatRecord,
    summaries: Sequence[ChatRecord],
) -> UndeclaredDiscontinuityError:
    """The most specific error for a request that does not extend `head` (its context's head);
    `summaries` are the heads of the agent's auxiliary contexts (possible summary calls)."""
    found = summary_message(messages, summaries)
    if found is not None:
        return rewrite_error(*found, err)
    if not tools and head.tools:
        return _with(
            UndeclaredAuxiliaryCallError,
            err,
            f"the request has no tools while agent {head.agent!r}'s context {head.context_id!r} has "
            f"{len(head.tools)}: it looks like an auxiliary call (a summary or title call) ({err}). Send it "
            f"with the header {AUX_KIND_ADVICE}; if it is another agent's request, name the agent with "
            f"`{AGENT_HEADER}`",
        )
    asked = _asks_for_summary(messages, tools, head)
    if asked is not None:
        return _with(
            UndeclaredAuxiliaryCallError,
            err,
            f"message {asked} asks for a summary: the request looks like a summary call of agent "
            f"{head.agent!r}, not a continuation of its context {head.context_id!r} ({err}). Send it with "
            f"the header {AUX_KIND_ADVICE}. Declare "
            f"`{REWRITE_HEADER}: 1` only on the agent's next request, whose history the summary replaced",
        )
    rewritten = _reads_as_summary(messages, tools, head, err)
    if rewritten is not None:
        return rewrite_error(rewritten, "a message that reads as a summary of the conversation", err)
    fresh = not any(m.get("role") == "assistant" for m in messages)  # a conversation's first request
    if not identity.named and (err.index is None or err.index == 0 or fresh):
        return _with(
            MissingIdentityHeadersError,
            err,
            f"the request carries no identity header, so it went to the default agent {head.agent!r}, "
            f"whose context {head.context_id!r} it does not extend ({err}). If another agent sent it, name "
            f"it with `{AGENT_HEADER}: <name>` and, for a worker, `{SPAWNED_BY_HEADER}: <the x-grove-call-id "
            "of the response that started it>`; if it is a summary call, send "
            f"`{KIND_HEADER}: summary`; if the history was compacted, `{REWRITE_HEADER}: 1`",
        )
    return err


def _reads_as_summary(
    messages: Sequence[dict[str, Any]], tools: Any, head: ChatRecord, err: UndeclaredDiscontinuityError
) -> int | None:
    """The index of the first message, from the first differing one on, that reads as a summary, in a
    request with the context's own tools; None otherwise (another agent's request has other tools)."""
    if err.index is None or not same_tools(tools, head.tools):
        return None
    for i in range(err.index, len(messages)):
        if messages[i].get("role") in ("user", "system") and SUMMARY_WORDS.search(
            text_of(messages[i].get("content"))[:SUMMARY_HEAD_CHARS]
        ):
            return i
    return None


def _asks_for_summary(messages: Sequence[dict[str, Any]], tools: Any, head: ChatRecord) -> int | None:
    """The index of the request's last message, or of its system message, when it asks for a summary
    (SUMMARY_ASK in its first lines), in a request with the context's own tools or none; else None
    (another agent's request has other tools: it is an identity mistake, not a summary call)."""
    if not messages or (tools and not same_tools(tools, head.tools)):
        return None
    candidates = [len(messages) - 1, *(i for i, m in enumerate(messages) if m.get("role") == "system")]
    for i in candidates:
        message = messages[i]
        if message.get("role") in ("user", "system") and SUMMARY_ASK.search(
            text_of(message.get("content"))[:SUMMARY_HEAD_CHARS]
        ):
            return i
    return None
