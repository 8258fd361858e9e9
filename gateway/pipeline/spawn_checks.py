"""The spawn rules of planning (gateway/pipeline/planning.py): which live context a worker's request may go
to, and which new agents and new spawns are wiring mistakes rather than what they claim to be.

- A request naming its spawner continues (or retries) a live context of its agent only if it extends
  that context's head; a repeat of another spawn's request is a new invocation (`spawner_of`).
- Before a new spawn: a summarised history, or a tool-less call of an agent whose contexts have tools,
  is a rewrite or an auxiliary call sent without its header (400, naming the header).
- An episode whose spec says `unspawned_agents="refuse"` refuses a new agent that names no spawner while
  another agent is the root (400 UnspawnedAgentError); otherwise it is accepted and the summary warns.

Pure module.
"""

from __future__ import annotations

from capture.records import ChatRecord
from gateway.intake.capture_request import CaptureRequest
from gateway.pipeline.capture_errors import UnspawnedAgentError
from gateway.pipeline.continuation import Decision, UndeclaredDiscontinuityError, decide
from gateway.pipeline.hints import (
    AUX_KIND_ADVICE,
    UndeclaredAuxiliaryCallError,
    rewrite_error,
    summary_message,
)
from gateway.pipeline.identity import AUX_SEPARATOR, Identity
from gateway.pipeline.routing import Target
from grove.contracts import EpisodeSpec
from grove.headers import PARENT_CONTEXT_HEADER, SPAWNED_BY_HEADER
from grove.receipts import CallKind, ContextOrigin
from ledger.accounting import ContextSummary
from ledger.context_view import ContextView


def try_decide(request: CaptureRequest, head: ChatRecord, identity: Identity) -> Decision | None:
    try:
        return decide(request.messages, request.tools, head, identity.rewrite)
    except UndeclaredDiscontinuityError:
        return None


def spawner_of(summary: ContextView, ctx: ContextSummary) -> str | None:
    """The call that spawned the context's lineage (a rewrite's spawner is its first context's)."""
    return summary.lineage_spawners.get(ctx.context_id, ctx.spawned_by_call)


def check_fresh_spawn(request: CaptureRequest, heads: list[ChatRecord], summaries: list[ChatRecord]) -> None:
    """Before a new spawn: a summarised history or a tool-less call of an agent that has tools is a
    wiring mistake (a rewrite or an auxiliary call without its header), not a fresh invocation."""
    if not heads:
        return
    live = [h.context_id for h in heads]
    found = summary_message(request.messages, summaries)
    if found is not None:
        index, source = found
        what = f"it extends none of agent {heads[0].agent!r}'s live contexts {live}"
        err = UndeclaredDiscontinuityError(what, index=index, field="content")
        raise rewrite_error(index, source, err)
    if not request.tools and all(h.tools for h in heads):
        raise UndeclaredAuxiliaryCallError(
            f"the request names its spawner ({SPAWNED_BY_HEADER} / {PARENT_CONTEXT_HEADER}) but has no "
            f"tools while agent {heads[0].agent!r}'s contexts {live} have them: it looks like an auxiliary "
            f"call (a summary or title call), not a new invocation of the worker. Send it with the header "
            f"{AUX_KIND_ADVICE}",
            index=None,
            field="tools",
        )


def check_unspawned(spec: EpisodeSpec, summary: ContextView, identity: Identity, target: Target) -> None:
    """Strict episodes refuse a new agent that names no spawner while another agent is the root."""
    opening = target.opening
    if (
        spec.unspawned_agents != "refuse"
        or opening is None
        or opening.origin != ContextOrigin.ROOT
        or identity.kind != CallKind.ACTION
        or AUX_SEPARATOR in target.agent
    ):
        return
    roots = sorted(summary.root_agents)  # the view leaves out auxiliary agents (`~`)
    if roots:
        raise UnspawnedAgentError(
            f"episode {summary.episode_id!r}: agent {target.agent!r} is new and names no spawner, and the "
            f"episode already has the root agent(s) {roots}; this episode refuses unspawned agents "
            "(EpisodeSpec.unspawned_agents='refuse'). Send the worker's requests with the header "
            f"`{SPAWNED_BY_HEADER}: <the x-grove-call-id of the response that started it>` (or "
            f"`{PARENT_CONTEXT_HEADER}: <that response's x-grove-context>`)"
        )
