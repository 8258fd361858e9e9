"""Which agent and context a chat request belongs to, from its headers (grove's own or a harness adapter's).

grove's headers (grove/headers.py; any harness can send them, e.g. LangGraph `default_headers`, Agents SDK
`extra_headers`):

    x-grove-agent: worker-1            the agent (default "parent"); any printable name, made canonical
    x-grove-context: worker-1.0        an explicit context id (default: the agent's current context)
    x-grove-spawned-by: parent.0.c2    the call whose response spawned this worker (its x-grove-call-id)
    x-grove-parent-context: parent.0   or: the context whose head spawned it
    x-grove-rewrite: 1                 this request rewrites the agent's history (compaction): new context
    x-grove-call-kind: summary         the summary of the agent's context (a compaction's summary call):
                                       its own context, trained when the run trains summaries
    x-grove-call-kind: title           a title for the conversation: its own context, never trained
    x-grove-call-kind: auxiliary       any other helper call: its own context, never trained

Every response carries `x-grove-call-id`, `x-grove-context` and `x-grove-agent` (the canonical name):
what a harness names as `x-grove-spawned-by` of the workers a response starts.

Agent names. A name of letters, digits, '_' and '-' (at most 96) is used as it is. Any other printable
name (the Agents SDK's "Math Tutor", "team.lead", "role:critic") is accepted and made canonical by
`canonical_agent`: runs of other characters become one '-', the result is cut to 80 characters and
suffixed with '-' + the first 8 hex digits of the sha256 of the name as sent (UTF-8), so distinct names
stay distinct and the same name always maps to the same agent ("Math Tutor" -> "Math-Tutor-<8 hex>").
Adapters may call `canonical_agent` themselves to know the agent id in advance.

Spawns. A request that names its spawner (`x-grove-spawned-by` or `x-grove-parent-context`; send it on
*every* request of the worker, not only the first) and extends none of its agent's live contexts opens a
new SPAWN context for that agent: a worker invoked again with a fresh history (a second `as_tool` call,
a second LangGraph `Send` round) is a new spawn, not an error. Without a spawner such a request is an
undeclared discontinuity (HTTP 400) whose error names the header that fixes it.

A new agent without a spawner opens a ROOT context: accepted (the episode's `summary` query lists it
under `warnings`), or refused with `UnspawnedAgentError` when the episode's spec sets
`unspawned_agents="refuse"` (gateway/pipeline/spawn_checks.py).

An auxiliary call without an explicit context goes to the agent's auxiliary agent named by its kind,
`<agent>~summary`, `<agent>~title` or `<agent>~aux` (a context of its own, so it never breaks the
agent's token stream); each unrelated auxiliary call there is a rewrite of the previous one. A new wire
format marks its compaction request the same way: its adapter returns `auxiliary_identity(agent,
CallKind.SUMMARY)` (as gateway/pipeline/opencode.py does), or its client sends `x-grove-call-kind: summary`.
OpenCode's `x-session-id` / `x-parent-session-id` are handled by gateway/pipeline/opencode.py when no grove
agent/context header is present (gateway/pipeline/routing.py chooses).

Pure module: headers in, an `Identity` out; the Temporal-side lookup happens in gateway/pipeline/planning.py.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from grove.headers import (
    AGENT_HEADER,
    CONTEXT_HEADER,
    KIND_HEADER,
    PARENT_CONTEXT_HEADER,
    REWRITE_HEADER,
    SPAWNED_BY_HEADER,
)
from grove.receipts import AUX_SEPARATOR, CallKind

DEFAULT_AGENT = "parent"
# canonical agent names never contain AUX_SEPARATOR: `<agent>~aux` never collides with a harness's agent
AUX_PURPOSE = {CallKind.SUMMARY: "summary", CallKind.TITLE: "title", CallKind.AUXILIARY: "aux"}
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,96}$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")
CANONICAL_STEM_CHARS = 80  # + '-' + 8 hex digits: canonical names stay within _NAME's 96
# Ids from headers become parts of object keys: the longest file name derived from a context id is
# its call's staged receipt `{context}.c{n}.receipt-{sha256}.json` (id + ~90 characters), and file
# systems allow 255 bytes per name (ENAMETOOLONG beyond). 128 characters keep every derived name
# under 230 (a unit test writes the longest ones to a real store).
MAX_ID_CHARS = 128
ID_PATTERN = re.compile(r"^[A-Za-z0-9_~-]{1,96}(\.[A-Za-z0-9_~-]{1,32}){0,4}$")

_TRUE, _FALSE = frozenset({"1", "true", "yes"}), frozenset({"0", "false", "no"})


class InvalidIdentityHeaderError(ValueError):
    """An identity header with a value the gateway does not accept."""


def canonical_agent(name: str) -> str:
    """The agent id of a harness's agent name (see the module docstring): the name itself when it is
    letters, digits, '_' and '-' (at most 96), else `<slug>-<sha256[:8]>`. Deterministic."""
    if _NAME.match(name):
        return name
    stem = _NOT_NAME.sub("-", name).strip("-")[:CANONICAL_STEM_CHARS].strip("-") or "agent"
    return f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def agent_header(headers: Mapping[str, str]) -> str | None:
    """The canonical agent of `x-grove-agent` (None when absent); any printable name is accepted."""
    value = headers.get(AGENT_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise InvalidIdentityHeaderError(
            f"header {AGENT_HEADER}: {value[:40]!r}{'...' if len(value) > 40 else ''} is not accepted; "
            f"expected a printable agent name of 1 to {MAX_ID_CHARS} characters (names other than "
            "letters, digits, '_' and '-' are made canonical: gateway.pipeline.identity.canonical_agent)"
        )
    return canonical_agent(value)


class RewriteMode(StrEnum):
    """What to do when a request does not extend its context's head."""

    NONE = "none"  # an undeclared discontinuity: refused (400), nothing admitted
    DECLARED = "declared"  # the harness declared a rewrite: always a new context, whatever the messages
    IF_NOT_EXTENSION = "if_not_extension"  # an adapter recognised a rewrite: new context unless it extends


@dataclass(frozen=True)
class Spawner:
    """Who spawned a worker's first context: a call id, or the head of a context, or of an agent's
    current context (exactly one is set)."""

    call_id: str | None = None
    context_id: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class Identity:
    agent: str | None  # None: the explicit context's agent (or DEFAULT_AGENT for a new context)
    context_id: str | None = None
    spawner: Spawner | None = None
    rewrite: RewriteMode = RewriteMode.NONE
    kind: CallKind = CallKind.ACTION
    session_id: str | None = None  # the harness's own session id (OpenCode), kept in the chat record
    root_session: bool = False  # this session claims the root agent (checked against earlier records)
    # grove's headers named the spawner: a request that extends none of the agent's live contexts opens
    # a new SPAWN context (a worker invoked again with a fresh history)
    respawn: bool = False
    named: bool = True  # False: no identity header at all (the default agent "parent" was assumed)


def aux_agent(agent: str, purpose: str) -> str:
    return f"{agent}{AUX_SEPARATOR}{purpose}"


def auxiliary_identity(agent: str, kind: CallKind, session_id: str | None = None) -> Identity:
    """An auxiliary call of `agent` of `kind` (a harness adapter's recognition: OpenCode's summary and
    title calls, a new wire format's compaction request): its own context `<agent>~<purpose>`, a new
    root unless it extends that context's head."""
    return Identity(
        agent=aux_agent(agent, AUX_PURPOSE[kind]),
        rewrite=RewriteMode.IF_NOT_EXTENSION,
        kind=kind,
        session_id=session_id,
    )


def header_value(headers: Mapping[str, str], name: str, pattern: re.Pattern[str] = _NAME) -> str | None:
    """A header's value checked against `pattern` (names become context ids, call ids and object keys)."""
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if len(value) > MAX_ID_CHARS:
        raise InvalidIdentityHeaderError(
            f"header {name}: a value of {len(value)} characters is not accepted; ids become object keys "
            f"and may have at most {MAX_ID_CHARS} characters (gateway.pipeline.identity.MAX_ID_CHARS)"
        )
    if not pattern.match(value):
        raise InvalidIdentityHeaderError(
            f"header {name}: {value!r} is not accepted; expected {pattern.pattern} (letters, digits, '_' "
            "and '-'; ids may have '.'-separated parts)"
        )
    return value


def _flag(headers: Mapping[str, str], name: str) -> bool:
    value = (headers.get(name) or "0").strip().lower()
    if value not in _TRUE | _FALSE:
        raise InvalidIdentityHeaderError(f"header {name}: {value!r} is not accepted; send 1 or 0")
    return value in _TRUE


def _kind(headers: Mapping[str, str]) -> CallKind:
    value = (headers.get(KIND_HEADER) or CallKind.ACTION.value).strip().lower()
    try:
        return CallKind(value)
    except ValueError:
        raise InvalidIdentityHeaderError(
            f"header {KIND_HEADER}: {value!r} is not a call kind; "
            f"expected one of {[k.value for k in CallKind]}"
        ) from None


def check_headers(headers: Mapping[str, str]) -> None:
    """Validate grove's identity headers that are present (values, lengths) without deciding anything:
    the routes call it before the request reaches Temporal, so a bad header costs nothing."""
    agent_header(headers)
    for name in (CONTEXT_HEADER, SPAWNED_BY_HEADER, PARENT_CONTEXT_HEADER):
        header_value(headers, name, ID_PATTERN)
    _flag(headers, REWRITE_HEADER)
    _kind(headers)


def grove_identity(headers: Mapping[str, str]) -> Identity:
    """Identity from grove's own headers (defaults: agent "parent", its current context)."""
    agent = agent_header(headers)
    context_id = header_value(headers, CONTEXT_HEADER, ID_PATTERN)
    spawned_by = header_value(headers, SPAWNED_BY_HEADER, ID_PATTERN)
    parent_context = header_value(headers, PARENT_CONTEXT_HEADER, ID_PATTERN)
    if spawned_by and parent_context:
        raise InvalidIdentityHeaderError(
            f"both {SPAWNED_BY_HEADER} and {PARENT_CONTEXT_HEADER} are set; send one of them"
        )
    spawner = Spawner(call_id=spawned_by, context_id=parent_context) if spawned_by or parent_context else None
    rewrite = RewriteMode.DECLARED if _flag(headers, REWRITE_HEADER) else RewriteMode.NONE
    kind = _kind(headers)
    if kind.auxiliary and context_id is None:
        # A context of its own: an unrelated auxiliary call replaces the previous one (a new root).
        agent = aux_agent(agent or DEFAULT_AGENT, AUX_PURPOSE[kind])
        spawner = None
        rewrite = RewriteMode.DECLARED if rewrite == RewriteMode.DECLARED else RewriteMode.IF_NOT_EXTENSION
    elif agent is None and context_id is None:
        agent = DEFAULT_AGENT
    names = (AGENT_HEADER, CONTEXT_HEADER, SPAWNED_BY_HEADER, PARENT_CONTEXT_HEADER)
    named = any(h in headers for h in names)
    return Identity(
        agent=agent,
        context_id=context_id,
        spawner=spawner,
        rewrite=rewrite,
        kind=kind,
        respawn=spawner is not None,
        named=named,
    )
