"""What the gateway tells the user about a call that was captured exactly but did not do what the harness
meant: limits set too small for delegation. Logged as a warning (the gateway's log, a `grove worker`'s for
its embedded gateway) and sent to the harness as the response header `x-grove-warning`.

- A tool call cut by max_tokens. The reply stopped at its token limit (`finish_reason: length`) inside a
  tool call (its opening marker, `<tool_call>` in grove's hermes format, without the end): the parser
  leaves it as plain text, so the harness sees no tool call and runs nothing. For OpenCode that is a
  `task` call whose subagents never start, and "delegation did not happen" for no visible reason: two
  `task` calls with their prompts take ~100-210 tokens, more than a 96-token `limit.output`. Raise the
  harness's output limit (OpenCode `limit.output`, the client's `max_tokens`).
- A compaction that does not end. OpenCode compacts a session after any step whose reported usage is at
  or over `limit.context - limit.output`; when the prompt right after a compaction is already over that
  line, it compacts again, forever (each time a summary call and a one-call context). Seen as a second
  rewrite of an OpenCode agent whose previous rewrite holds that one call only. Raise `limit.context`
  above the post-compaction prompt plus `limit.output`.

Each is said once per episode and agent by this gateway process (a loop would repeat it every turn).
"""

from __future__ import annotations

import logging

from capture.records import ChatRecord
from grove.receipts import ContextOrigin
from ledger.accounting import LedgerSummary

log = logging.getLogger("grove.gateway")

TOOL_CALL_MARKER = "<tool_call>"
_said: set[tuple[str, str, str]] = set()  # (episode, agent, kind): said already
MAX_SAID = 10_000  # forget past this many (a long-lived gateway serves many episodes)


def tool_call_cut(record: ChatRecord) -> str | None:
    """Advice when the reply hit its token limit inside an unfinished tool call (module docstring)."""
    content = record.response.get("content")
    if record.finish_reason != "length" or not record.tools or record.response.get("tool_calls"):
        return None
    if not isinstance(content, str) or TOOL_CALL_MARKER not in content:
        return None
    n = record.usage.completion_tokens
    return (
        f"episode {record.episode_id!r}, call {record.call_id!r} (agent {record.agent!r}): the reply hit its "
        f"token limit ({n} tokens, max_tokens) inside a tool call: the harness gets it as text and runs no "
        "tool (an OpenCode `task` call: no subagent starts). Raise the harness's output limit (OpenCode: "
        f"limit.output; else max_tokens) above what the call needs, more than {n} tokens"
    )


def compaction_loop(summary: LedgerSummary, record: ChatRecord) -> str | None:
    """Advice when the record opens an agent's second rewrite in a row, the first holding one call, in an
    OpenCode session (whose compaction rule this is; a program's own filter may rewrite every turn)."""
    if record.session_id is None:
        return None
    contexts = {c.context_id: c for c in summary.contexts}
    ctx = contexts.get(record.context_id)
    if ctx is None or ctx.origin != ContextOrigin.REWRITE or record.extends is not None:
        return None
    before = contexts.get(ctx.rewrite_of or "")
    if before is None or before.origin != ContextOrigin.REWRITE or sum(before.counts.values()) > 1:
        return None
    n = record.usage.prompt_tokens
    return (
        f"episode {record.episode_id!r}, agent {record.agent!r}: compacted again right after a compaction "
        f"(context {before.context_id!r} held one call): the prompt after a compaction ({n} tokens here) is "
        "already over the harness's compaction line, so it compacts forever. Raise the context limit "
        "(OpenCode: limit.context, which compacts at limit.context - limit.output) above that prompt plus "
        "the output limit"
    )


def may_loop(record: ChatRecord) -> bool:
    """Whether `compaction_loop` could apply (an OpenCode context's first call, not the agent's first
    context): only then is the episode's summary worth reading."""
    return record.session_id is not None and record.extends is None and not record.context_id.endswith(".0")


def say_once(record: ChatRecord, kind: str, advice: str | None) -> str | None:
    """Log `advice` unless said for this episode, agent and kind; returns it (for the response header)."""
    if advice is None:
        return None
    key = (record.episode_id, record.agent, kind)
    if key not in _said:
        if len(_said) >= MAX_SAID:
            _said.clear()
        _said.add(key)
        log.warning("%s", advice)
    return advice
