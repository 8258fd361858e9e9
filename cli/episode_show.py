"""`grove episode show EPISODE_ID`: what grove recorded of one episode, for a user who ran a harness.

    episode   adhoc/3f2a9c  running
    context   parent.0       root                         head parent.0.c1   completed 2
    context   researcher.0   spawned by parent.0.c0       head researcher.0.c0   completed 1
    warnings  none

and once it is closed, its result and rows (read from the object store, $GROVE_STORE):

    episode   adhoc/3f2a9c  ok  reward 0.500  calls selected 4, auxiliary 1
    row       adhoc/3f2a9c/r0  412 tokens, 38 with loss  calls parent.0.c0 (parent, loss), ...

A running episode answers from its ledger (the `summary` query: each context's agent, origin, spawn link,
rewrite, and the episode's warnings); a closed one from its result and rows.
"""

from __future__ import annotations

from grove.contracts import EpisodeResult
from grove.receipts import CallState
from trainer.rows import Row
from workflows.accounting import ContextSummary, LedgerSummary


def context_line(ctx: ContextSummary) -> str:
    if ctx.spawned_by_call:
        origin = f"spawned by {ctx.spawned_by_call}"
    elif ctx.rewrite_of:
        origin = f"rewrite of {ctx.rewrite_of}"
    else:
        origin = ctx.origin.value
    counts = ", ".join(f"{CallState(state).value} {n}" for state, n in ctx.counts.items() if n)
    return f"context   {ctx.context_id:24} {origin:32} head {ctx.head or '-':28} {counts}"


def summary_lines(episode_id: str, summary: LedgerSummary) -> list[str]:
    lines = [f"episode   {episode_id}  {'closing' if summary.closed else 'running'}"]
    lines += [context_line(c) for c in summary.contexts]
    lines.append("warnings  " + ("; ".join(summary.warnings) if summary.warnings else "none"))
    return lines


def row_line(row: Row) -> str:
    calls = ", ".join(f"{s.call_id} ({s.agent}{', loss' if s.owned else ''})" for s in row.spans)
    return (
        f"row       {row.row_id}  {row.input_ids.size} tokens, {row.num_loss_tokens} with loss  calls {calls}"
    )


def result_lines(result: EpisodeResult, rows: list[Row]) -> list[str]:
    counts = ", ".join(f"{state} {n}" for state, n in result.counts.items())
    lines = [f"episode   {result.episode_id}  {result.status}  reward {result.reward:.3f}  calls {counts}"]
    if result.failure:
        lines.append(f"failure   {result.failure}")
    return lines + [row_line(r) for r in rows] + [f"rows      {len(rows)} at {result.rows_key}"]
