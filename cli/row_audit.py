"""`grove run check` / `grove episode check`: every row of a closed episode held against its call archive.

The rows are what the learner trains; the call archive (capture/call_archive.py) is what the engine
served each call, written from the staged arrays before staging is cleaned, with the ledger's receipts.
This audit reads the two side by side and re-derives, without the reconstruction's code, what the rows
must say:

- tokens: each span's completion is the call's completion ids, it starts where the call's prompt ends
  (`prompt_len`) and the tokens before it end with the call's archived prompt tail; the row ends with its
  endpoint's completion; spans are in order and do not overlap;
- loss: the loss mask is exactly the owned spans, each owned span is eligible, behaviour log-probabilities
  are the archived ones on loss positions (to the archive's 1e-5 rounding) and 0 elsewhere;
- processing: each span's temperature, top_p, policy version and agent are its receipt's;
- once-only: every call the run trains (selected actions of the agents it trains, and the auxiliary kinds
  it trains) is owned by exactly one row, and no other call by any; every call in a row is used
  (selected or auxiliary);
- links: every spawned context names a spawning call of another agent that the archive holds, every
  rewrite replaces an earlier context of the same agent, every call belongs to a known context;
- the episode's result agrees: its rows' reward, its trained tokens, its calls per terminal state.

Pure: `audit_episode` takes the loaded objects; the commands do the reading (cli/row_check.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from capture.call_archive import ArchivedCall, CallArchive
from grove.contracts import EpisodeResult
from grove.receipts import AUX_SEPARATOR, CallKind, CallState, ContextOrigin, acting_agent
from trainer.rows import Row

LOGPROB_TOLERANCE = 2e-5  # the archive keeps 5 decimals; rows keep float32
ROOT_AGENT = "parent"  # the gateway's default root agent name


@dataclass
class EpisodeAudit:
    """What one episode's check found: counts for the report, and every violation in words."""

    episode_id: str
    rows: int = 0
    calls: Counter = field(default_factory=Counter)  # terminal state -> calls
    contexts: Counter = field(default_factory=Counter)  # origin -> contexts
    trained_calls: int = 0
    trained_tokens: int = 0
    summaries: int = 0
    summaries_trained: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        calls = ", ".join(f"{state} {n}" for state, n in sorted(self.calls.items()))
        head = "ok  " if self.ok else "FAIL"
        return (
            f"{head} {self.episode_id}  rows {self.rows}  calls {sum(self.calls.values())} ({calls})  "
            f"trained {self.trained_calls} calls / {self.trained_tokens} tokens  "
            f"spawns {self.contexts['spawn']}  rewrites {self.contexts['rewrite']}  "
            f"summaries {self.summaries} ({self.summaries_trained} trained)"
        )


def trained_agent_filter(archive: CallArchive, train_agents: str) -> set[str] | None:
    """The agents whose actions a `parent_only` run trains (None: all). The parent is the gateway's root
    agent `parent` where the episode has it, else its root agent that is no auxiliary agent."""
    if train_agents == "all":
        return None
    agents = {c.agent for c in archive.contexts}
    if ROOT_AGENT in agents:
        return {ROOT_AGENT}
    return {
        c.agent for c in archive.contexts if c.origin == ContextOrigin.ROOT and AUX_SEPARATOR not in c.agent
    }


def should_train(call: ArchivedCall, parents: set[str] | None, train_auxiliary: Sequence[str]) -> bool:
    receipt = call.receipt
    if parents is not None and acting_agent(receipt.agent) not in parents:
        return False
    if receipt.state == CallState.SELECTED:
        return True
    return receipt.state == CallState.AUXILIARY and receipt.kind.value in train_auxiliary


def _check_links(archive: CallArchive, calls: dict[str, ArchivedCall], audit: EpisodeAudit) -> None:
    contexts = {c.context_id: c for c in archive.contexts}
    for ctx in archive.contexts:
        audit.contexts[ctx.origin.value] += 1
        if ctx.origin == ContextOrigin.SPAWN:
            spawner = calls.get(ctx.spawned_by_call or "")
            if spawner is None:
                audit.violations.append(
                    f"context {ctx.context_id}: spawned by call {ctx.spawned_by_call!r}, which the archive "
                    "does not hold"
                )
            elif acting_agent(spawner.receipt.agent) == acting_agent(ctx.agent):
                audit.violations.append(
                    f"context {ctx.context_id}: spawned by {spawner.receipt.call_id}, a call of its own agent"
                )
        if ctx.origin == ContextOrigin.REWRITE:
            old = contexts.get(ctx.rewrite_of or "")
            if old is None or old.agent != ctx.agent:
                audit.violations.append(
                    f"context {ctx.context_id}: rewrites {ctx.rewrite_of!r}, which is no context of agent "
                    f"{ctx.agent!r}"
                )
    for call in calls.values():
        if call.receipt.context_id not in contexts:
            audit.violations.append(
                f"call {call.receipt.call_id}: its context {call.receipt.context_id} is unknown"
            )


def _span_violations(row: Row, calls: dict[str, ArchivedCall]) -> list[str]:
    """Token, processing and order checks of one row's spans."""
    out: list[str] = []
    ids = row.input_ids
    previous_end = 0
    for span in row.spans:
        where = f"row {row.row_id}, call {span.call_id}"
        call = calls.get(span.call_id)
        if call is None:
            out.append(f"{where}: not in the episode's call archive")
            continue
        receipt = call.receipt
        if receipt.state not in (CallState.SELECTED, CallState.AUXILIARY):
            out.append(f"{where}: a {receipt.state.value} call in a row (expected selected or auxiliary)")
        if span.start < previous_end or span.end < span.start:
            out.append(f"{where}: span [{span.start}, {span.end}) overlaps or precedes the one before it")
        previous_end = span.end
        if call.completion_ids is None or call.prompt_len is None:
            out.append(f"{where}: the archive has no arrays for it; its tokens cannot be checked")
            continue
        if span.start != call.prompt_len:
            out.append(f"{where}: completion starts at {span.start}, its prompt was {call.prompt_len} tokens")
        if ids[span.start : span.end].tolist() != call.completion_ids:
            out.append(f"{where}: tokens [{span.start}, {span.end}) are not the completion the engine served")
        tail = call.prompt_tail_ids or []
        if span.start < len(tail) or ids[span.start - len(tail) : span.start].tolist() != tail:
            out.append(f"{where}: the tokens before the completion are not the prompt it was served")
        sampling = receipt.sampling
        if sampling is None or (span.temperature, span.top_p) != (sampling.temperature, sampling.top_p):
            out.append(
                f"{where}: scored at temperature {span.temperature}, top_p {span.top_p}; sampled with "
                f"{None if sampling is None else (sampling.temperature, sampling.top_p)}"
            )
        if span.policy_version != receipt.policy_version or span.agent != receipt.agent:
            out.append(
                f"{where}: span says agent {span.agent!r} version {span.policy_version}, receipt "
                f"{receipt.agent!r} version {receipt.policy_version}"
            )
    if row.spans and row.spans[-1].end != ids.size:
        out.append(f"row {row.row_id}: ends at {ids.size}, its endpoint's completion at {row.spans[-1].end}")
    return out


def _loss_violations(row: Row, calls: dict[str, ArchivedCall]) -> list[str]:
    """The loss mask is the owned spans; behaviour log-probabilities the served ones there, 0 elsewhere."""
    out: list[str] = []
    mask = np.zeros(row.input_ids.size, dtype=bool)
    expected = np.zeros(row.input_ids.size, dtype=np.float64)
    for span in row.spans:
        if not span.owned:
            continue
        if not span.eligible:
            out.append(f"row {row.row_id}, call {span.call_id}: owned but not eligible")
        mask[span.start : span.end] = True
        call = calls.get(span.call_id)
        if call is not None and call.logprobs is not None and len(call.logprobs) == span.end - span.start:
            expected[span.start : span.end] = call.logprobs
    if not row.valid and row.loss_mask.any():
        out.append(f"row {row.row_id}: a failed episode's placeholder row with loss tokens")
    if not np.array_equal(row.loss_mask, mask):
        where = np.flatnonzero(row.loss_mask != mask)
        out.append(f"row {row.row_id}: loss mask differs from its owned spans at {where.size} positions")
    gap = np.abs(row.behavior_logprobs.astype(np.float64) - expected)
    if gap.size and gap.max() > LOGPROB_TOLERANCE:
        out.append(
            f"row {row.row_id}: behaviour log-probabilities differ from the served ones by up to "
            f"{gap.max():.3g}"
        )
    return out


def _check_once(
    archive: CallArchive,
    owners: Counter,
    calls: dict[str, ArchivedCall],
    train_agents: str,
    train_auxiliary: Sequence[str],
    audit: EpisodeAudit,
) -> None:
    parents = trained_agent_filter(archive, train_agents)
    for cid, call in sorted(calls.items()):
        expected = 1 if should_train(call, parents, train_auxiliary) else 0
        if owners[cid] != expected:
            audit.violations.append(
                f"call {cid} ({call.receipt.state.value}, {call.receipt.kind.value}, agent "
                f"{call.receipt.agent}): owned by {owners[cid]} rows, expected {expected}"
            )


def audit_episode(
    archive: CallArchive,
    rows: Sequence[Row],
    result: EpisodeResult,
    train_agents: str = "all",
    train_auxiliary: Sequence[str] = (),
) -> EpisodeAudit:
    """Every check above on one closed episode; the audit lists what failed (nothing when all holds)."""
    audit = EpisodeAudit(result.episode_id, rows=len(rows))
    calls = {c.receipt.call_id: c for c in archive.calls}
    audit.calls = Counter(c.receipt.state.value for c in archive.calls)
    _check_links(archive, calls, audit)
    for row in rows:
        audit.violations += _span_violations(row, calls) + _loss_violations(row, calls)
        if row.valid and row.reward != result.reward:
            audit.violations.append(f"row {row.row_id}: reward {row.reward}, the episode's {result.reward}")
    owners = Counter(s.call_id for r in rows for s in r.spans if s.owned)  # call -> rows that own it
    if result.status == "ok":
        _check_once(archive, owners, calls, train_agents, train_auxiliary, audit)
        audit.trained_calls = sum(owners.values())
    summaries = [cid for cid, c in calls.items() if c.receipt.kind == CallKind.SUMMARY]
    audit.summaries, audit.summaries_trained = len(summaries), sum(owners[cid] > 0 for cid in summaries)
    audit.trained_tokens = sum(int(r.loss_mask.sum()) for r in rows)
    if audit.trained_tokens != result.eligible_tokens:
        audit.violations.append(
            f"rows train {audit.trained_tokens} tokens, the episode's result says {result.eligible_tokens}"
        )
    if result.status == "ok" and dict(result.counts) != dict(audit.calls):
        audit.violations.append(
            f"calls per state {dict(audit.calls)}, the episode's result says {result.counts}"
        )
    return audit
