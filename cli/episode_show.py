"""`grove episode show EPISODE_ID`: what grove recorded of one episode, for a user who ran a harness.

    episode   adhoc/3f2a9c  running  contexts 2
    context   parent.0       parent       root                          head parent.0.c1  completed 2
    context   researcher.0   researcher   spawned by parent.0.c0        head researcher.0.c0  completed 1
    warnings  none

and once it is closed, its result, its contexts (agents, spawn links, rewrites; read from the map the
close wrote beside the rows, activities/episode_map.py) and its rows (both from the object store,
$GROVE_STORE):

    episode   adhoc/3f2a9c  ok  reward 0.500  calls selected 4, auxiliary 1
    context   parent.0       parent       root                          selected 2
    context   parent.1       parent       rewrite of parent.0           selected 1
    row       adhoc/3f2a9c/r0  412 tokens, 38 with loss  calls parent.0.c0 (parent, loss), ...

A running episode answers from its ledger, one page of contexts per `summary` query (SummaryPage): each
answer is bounded, so an episode of any number of contexts is shown whole.
"""

from __future__ import annotations

from grove.contracts import EpisodeResult
from grove.receipts import CallState
from ledger.accounting import ContextSummary, LedgerSummary
from trainer.rows import Row


def context_line(ctx: ContextSummary, *, head: bool = True) -> str:
    if ctx.spawned_by_call:
        origin = f"spawned by {ctx.spawned_by_call}"
    elif ctx.rewrite_of:
        origin = f"rewrite of {ctx.rewrite_of}"
    else:
        origin = ctx.origin.value
    if ctx.retired_by:
        origin += f", rewritten by {ctx.retired_by}"
    counts = ", ".join(f"{CallState(state).value} {n}" for state, n in ctx.counts.items() if n)
    where = f"head {ctx.head or '-':28} " if head else ""
    return f"context   {ctx.context_id:24} {ctx.agent:20} {origin:40} {where}{counts or 'no calls'}"


def summary_lines(episode_id: str, pages: list[LedgerSummary]) -> list[str]:
    """A running episode: every page of its summary, in order (the warnings are the first page's)."""
    first = pages[0]
    state = "closing" if first.closed else "running"
    lines = [f"episode   {episode_id}  {state}  contexts {first.context_count}"]
    lines += [context_line(c) for page in pages for c in page.contexts]
    lines.append("warnings  " + ("; ".join(first.warnings) if first.warnings else "none"))
    return lines


def row_line(row: Row) -> str:
    calls = ", ".join(f"{s.call_id} ({s.agent}{', loss' if s.owned else ''})" for s in row.spans)
    return (
        f"row       {row.row_id}  {row.input_ids.size} tokens, {row.num_loss_tokens} with loss  calls {calls}"
    )


def result_lines(
    result: EpisodeResult, rows: list[Row], contexts: list[ContextSummary] | None = None
) -> list[str]:
    """A closed episode: its result, its contexts (None: the close wrote no map of them) and rows."""
    counts = ", ".join(f"{state} {n}" for state, n in result.counts.items())
    lines = [f"episode   {result.episode_id}  {result.status}  reward {result.reward:.3f}  calls {counts}"]
    if result.failure:
        lines.append(f"failure   {result.failure}  ({result.failure_kind or 'unknown'} failure)")
    if contexts is None:
        lines.append("contexts  not recorded (the episode closed before grove wrote context maps)")
    else:
        lines += [context_line(c, head=False) for c in contexts]
    return lines + [row_line(r) for r in rows] + [f"rows      {len(rows)} at {result.rows_key}"]
