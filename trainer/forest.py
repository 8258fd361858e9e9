"""Exact forest reconstruction: an episode's receipts + staged tokens -> training rows + accounting.

Rules (docs/design.md, "6. Reconstruction"):

- Forest members are the calls the harness used: state SELECTED (actions) and AUXILIARY. Discarded,
  cancelled and failed calls are accounted, never trained, and need no tokens.
- Every member's staged arrays must match its receipt digests (`CallTokens.digests()`).
- Every parent link is verified on tokens: child.prompt starts with parent.prompt + parent.completion.
  Each child compares only its own prompt prefix, so the work is linear in total tokens. A member whose
  parent is not a member is `MissingSelectedPredecessorError`; a link to another context, a mismatch
  (named by its first differing position) or a cycle are errors too. Nothing is guessed.
- Endpoints are members with no member child; each endpoint's row is its prompt + completion, which
  (links being verified) holds every ancestor's completion at [prompt_len, prompt_len + completion_len).
- Eligible calls: SELECTED actions, and the AUXILIARY calls of a kind the run trains
  (`train_auxiliary`: only SUMMARY may be named, grove/contracts/episode.py; a summary is then its
  agent's action like any other), of every agent or of the parent agent only
  (`train_agents="parent_only"`, the parent-only baseline; an auxiliary agent `parent~summary` acts for
  `parent`: grove/receipts.py `acting_agent`). Titles and other auxiliary calls are never eligible.
  Each eligible call is owned by exactly one row (trainer/ownership.py: first endpoint in canonical
  order among its descendants). `loss_mask` is True only on owned eligible completion tokens,
  `behavior_logprobs` are the staged logprobs there and 0 elsewhere. Every span carries its call's
  sampling processing (temperature, top_p from the receipt; a member without it is
  `MissingSamplingError`): the learner scores the span's tokens under it. Everything else — prompts,
  observations (tool results, worker answers, user turns, a summary fed back into its rewritten
  context), other rows' completions — is conditioning with mask 0.
- An endpoint whose row would own no eligible call (an auxiliary leaf, a worker under "parent_only")
  produces no row: it would carry no loss. The accounting lists it under `endpoints_without_loss`.
- Rows come out sorted by (context_id, depth, call_id) of their endpoint; the same receipts and
  tokens in any order give byte-identical Parquet (trainer/rows.py rows_to_parquet documents the
  columns: row_id, episode_id, group_id, input_ids, loss_mask, behavior_logprobs, spans, reward, valid).

Pure module: numpy + pydantic, no I/O, no Temporal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from grove.contracts.episode import TrainAuxiliary
from grove.receipts import TERMINAL_STATES, CallKind, CallReceipt, CallState, TokenDigests, acting_agent
from grove.sampling import SamplingProcessing
from grove.staging_format import CallTokens
from trainer.ownership import ForestPlan, Link, plan_forest
from trainer.rows import Row, Span

MEMBER_STATES: frozenset[CallState] = frozenset({CallState.SELECTED, CallState.AUXILIARY})


# ----------------------------------------------------------------------------------------------- errors


class ForestError(ValueError):
    """The episode's receipts/tokens do not form an exact forest. Names the ids and what to do."""

    def __init__(self, episode_id: str, call_ids: Iterable[str], problem: str, expected: str, action: str):
        self.episode_id = episode_id
        self.call_ids = list(call_ids)
        super().__init__(
            f"{problem} [episode {episode_id}, calls {self.call_ids}]; expected: {expected}; to fix: {action}"
        )


class DuplicateReceiptError(ForestError):
    """Two receipts with the same call id."""


class UnsettledCallError(ForestError):
    """A receipt still admitted/completed: the ledger was not closed."""


class InconsistentReceiptError(ForestError):
    """A member receipt without digests/policy version, or whose state contradicts its kind."""


class MissingSamplingError(InconsistentReceiptError):
    """A member receipt without the sampling processing it was generated with (temperature, top_p)."""


class MissingTokensError(ForestError):
    """A forest member whose staged arrays were not provided."""


class ForeignTokensError(ForestError):
    """Staged arrays for a call id that no receipt names."""


class TokenDigestMismatchError(ForestError):
    """Staged arrays whose digests differ from the receipt's."""


class MissingSelectedPredecessorError(ForestError):
    """A member whose parent call is not a member (discarded, failed, cancelled or absent)."""


class CrossContextLinkError(ForestError):
    """A parent link between calls of different contexts."""


class ParentLinkMismatchError(ForestError):
    """A child's prompt does not start with its parent's prompt + completion."""


class EmptyPromptError(ForestError):
    """A member with an empty prompt: its first sampled token has nothing to be conditioned on."""


class UnknownParentAgentError(ForestError):
    """`parent_only` training, but no receipt belongs to the named parent agent."""


class LossAccountingError(ForestError):
    """Internal guard: the rows' loss tokens do not add up to the eligible tokens (a bug, never data)."""


# ----------------------------------------------------------------------------------------------- models


class ReconstructionOptions(BaseModel):
    """Which calls the run trains."""

    model_config = ConfigDict(frozen=True)

    train_agents: Literal["all", "parent_only"] = "all"
    parent_agent: str = "parent"
    # auxiliary call kinds trained as their agent's actions: [] or ["summary"] (others are refused)
    train_auxiliary: TrainAuxiliary = []


class EpisodeRef(BaseModel):
    """The owner of the rows: the logical rollout and its GRPO group."""

    model_config = ConfigDict(frozen=True)

    episode_id: str
    group_id: str


class AgentAccounting(BaseModel):
    states: dict[CallState, int]
    eligible_calls: int = 0
    eligible_tokens: int = 0
    rows: int = 0  # rows whose endpoint belongs to this agent


class ForestAccounting(BaseModel):
    """What the reconstruction did with every call of the episode (ids sorted)."""

    episode_id: str
    group_id: str
    options: ReconstructionOptions
    by_state: dict[CallState, list[str]]  # terminal states only; every receipt exactly once
    members: int  # calls in the forest (selected + auxiliary)
    verified_links: int
    endpoints: list[str]  # canonical order
    endpoints_without_loss: list[str]
    rows: int
    eligible_calls: list[str]
    eligible_tokens: int  # == total loss tokens over all rows (each eligible token owned once)
    per_agent: dict[str, AgentAccounting]
    summary_calls: list[str] = []  # members of kind SUMMARY (compactions' summaries), sorted
    summary_calls_trained: list[str] = []  # of them, the eligible ones (train_auxiliary: [summary])
    summary_tokens_trained: int = 0  # their completion tokens (each trained once)


@dataclass(frozen=True)
class Reconstruction:
    rows: list[Row]
    accounting: ForestAccounting


# ----------------------------------------------------------------------------------------------- checks


def _index(episode_id: str, receipts: Iterable[CallReceipt]) -> dict[str, CallReceipt]:
    by_id: dict[str, CallReceipt] = {}
    for receipt in receipts:
        if receipt.call_id in by_id:
            raise DuplicateReceiptError(
                episode_id,
                [receipt.call_id],
                f"two receipts for call {receipt.call_id!r}",
                "one receipt per call id",
                "pass the closed ledger's receipts once each",
            )
        by_id[receipt.call_id] = receipt
    unsettled = sorted(c for c, r in by_id.items() if r.state not in TERMINAL_STATES)
    if unsettled:
        raise UnsettledCallError(
            episode_id,
            unsettled,
            f"{len(unsettled)} calls are not in a terminal state",
            f"every call in one of {sorted(s.value for s in TERMINAL_STATES)}",
            "close the episode's ledger before reconstructing",
        )
    return dict(sorted(by_id.items()))


@dataclass(frozen=True)
class _Checked:
    """A member receipt's fields that `_check_member` proved present."""

    digests: TokenDigests
    policy_version: int
    sampling: SamplingProcessing


def _check_member(episode_id: str, r: CallReceipt) -> _Checked:
    wrong_kind = (r.state == CallState.SELECTED) != (r.kind == CallKind.ACTION)
    if r.digests is None or r.policy_version is None or wrong_kind:
        raise InconsistentReceiptError(
            episode_id,
            [r.call_id],
            f"receipt of {r.call_id!r} is {r.state.value} (kind {r.kind.value}) with digests "
            f"{'set' if r.digests else 'missing'} and policy version {r.policy_version}",
            "selected actions / auxiliary auxiliaries, with digests and a policy version",
            "rebuild the receipts from the closed ledger",
        )
    if r.sampling is None:
        raise MissingSamplingError(
            episode_id,
            [r.call_id],
            f"receipt of {r.call_id!r} records no sampling processing (temperature, top_p)",
            "every used call completed with the sampling its generate activity returned "
            "(GenerateResult.sampling -> ledger.complete(..., sampling=...))",
            "re-run the episode: without it the learner cannot score the call's tokens as they were sampled",
        )
    if r.digests.prompt_len == 0:
        raise EmptyPromptError(
            episode_id,
            [r.call_id],
            f"call {r.call_id!r} has an empty prompt",
            "at least one prompt token (the first sampled token is scored from the one before it)",
            "fix the harness/gateway that sent an empty prompt",
        )
    return _Checked(r.digests, r.policy_version, r.sampling)


def _check_tokens(
    episode_id: str,
    by_id: Mapping[str, CallReceipt],
    members: Mapping[str, CallReceipt],
    checked: Mapping[str, _Checked],
    tokens: Mapping[str, CallTokens],
) -> None:
    foreign = sorted(set(tokens) - set(by_id))
    if foreign:
        raise ForeignTokensError(
            episode_id,
            foreign,
            "staged arrays for calls that no receipt names",
            "arrays only for this episode's calls",
            "load staging objects of this episode only",
        )
    missing = [c for c in members if c not in tokens]
    if missing:
        raise MissingTokensError(
            episode_id,
            missing,
            "no staged arrays for forest members",
            "CallTokens for every selected and auxiliary call",
            "load every member's staging object",
        )
    for call_id, receipt in members.items():
        got = tokens[call_id].digests()
        want = checked[call_id].digests
        if got != want:
            fields = [f for f in type(got).model_fields if getattr(got, f) != getattr(want, f)]
            raise TokenDigestMismatchError(
                episode_id,
                [call_id],
                f"staged arrays of {call_id!r} differ from its receipt in {fields}",
                f"digests {want.model_dump()}",
                f"the staging object {receipt.staging_key} is corrupt or foreign; regenerate the episode",
            )


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    # Byte comparison (memcmp) is faster than np.array_equal on the typical 1-4k-token slice;
    # it equals element equality only for one dtype, so other dtypes take the numpy path.
    if a.dtype == b.dtype:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _verify_link(
    episode_id: str, child: CallReceipt, parent: CallReceipt, tokens: Mapping[str, CallTokens]
) -> None:
    ids = [child.call_id, parent.call_id]
    if parent.context_id != child.context_id:
        raise CrossContextLinkError(
            episode_id,
            ids,
            f"{child.call_id!r} (context {child.context_id!r}) claims parent "
            f"{parent.call_id!r} of context {parent.context_id!r}",
            "a parent in the same context",
            "rebuild the receipts from the closed ledger",
        )
    ct, pt = tokens[child.call_id], tokens[parent.call_id]
    p, c = pt.prompt_ids.size, pt.completion_ids.size
    prompt = ct.prompt_ids
    ok = (
        prompt.size >= p + c
        and _equal(prompt[:p], pt.prompt_ids)
        and _equal(prompt[p : p + c], pt.completion_ids)
    )
    if not ok:
        expected = np.concatenate([pt.prompt_ids, pt.completion_ids])
        at = _first_difference(prompt, expected)
        raise ParentLinkMismatchError(
            episode_id,
            ids,
            f"prompt of {child.call_id!r} ({prompt.size} tokens) differs from "
            f"{parent.call_id!r}'s prompt + completion ({p}+{c} tokens) first at position {at}",
            "child.prompt[: parent prompt + completion] == parent.prompt + parent.completion",
            "the harness rewrote the history without declaring it: open a REWRITE context (new root)",
        )


def _verify_links(
    episode_id: str, members: Mapping[str, CallReceipt], tokens: Mapping[str, CallTokens]
) -> dict[str, Link]:
    links: dict[str, Link] = {}
    for call_id, receipt in members.items():
        parent_id = receipt.parent_call_id
        if parent_id is not None:
            parent = members.get(parent_id)
            if parent is None:
                raise MissingSelectedPredecessorError(
                    episode_id,
                    [call_id, parent_id],
                    f"{receipt.state.value} call {call_id!r} extends {parent_id!r}, which is not selected",
                    "every used call's predecessor used too (selected or auxiliary)",
                    f"do not discard {parent_id!r} while {call_id!r} builds on it, or discard both",
                )
            _verify_link(episode_id, receipt, parent, tokens)
        links[call_id] = Link(context_id=receipt.context_id, parent=parent_id)
    return links


# ----------------------------------------------------------------------------------------------- rows


def _eligible(members: Mapping[str, CallReceipt], options: ReconstructionOptions) -> set[str]:
    def trains(r: CallReceipt) -> bool:
        if options.train_agents == "parent_only" and acting_agent(r.agent) != options.parent_agent:
            return False
        return r.state == CallState.SELECTED or r.kind.value in options.train_auxiliary

    return {c for c, r in members.items() if trains(r)}


def _row(
    episode: EpisodeRef,
    endpoint: str,
    plan: ForestPlan,
    members: Mapping[str, CallReceipt],
    checked: Mapping[str, _Checked],
    tokens: Mapping[str, CallTokens],
    eligible: set[str],
    reward: float,
) -> Row:
    end_tokens = tokens[endpoint]
    input_ids = np.concatenate([end_tokens.prompt_ids, end_tokens.completion_ids]).astype(np.int32)
    loss_mask = np.zeros(input_ids.size, dtype=np.bool_)
    logprobs = np.zeros(input_ids.size, dtype=np.float32)
    spans = []
    for call_id in plan.path(endpoint):
        receipt, member = members[call_id], checked[call_id]
        start = member.digests.prompt_len
        end = start + member.digests.completion_len
        owned = call_id in eligible and plan.owner[call_id] == endpoint
        if owned:
            loss_mask[start:end] = True
            logprobs[start:end] = tokens[call_id].logprobs
        spans.append(
            Span(
                call_id,
                receipt.agent,
                start,
                end,
                owned,
                call_id in eligible,
                member.policy_version,
                temperature=member.sampling.temperature,
                top_p=member.sampling.top_p,
            )  # fmt: skip
        )
    return Row(
        row_id=f"{episode.episode_id}#{endpoint}",
        episode_id=episode.episode_id,
        group_id=episode.group_id,
        input_ids=input_ids,
        loss_mask=loss_mask,
        behavior_logprobs=logprobs,
        spans=tuple(spans),
        reward=float(reward),
    )


def _owns_any(endpoint: str, plan: ForestPlan, eligible: set[str]) -> bool:
    return any(plan.owner[c] == endpoint for c in plan.path(endpoint) if c in eligible)


# ----------------------------------------------------------------------------------------------- entry


def reconstruct(
    episode: EpisodeRef,
    receipts: Iterable[CallReceipt],
    tokens: Mapping[str, CallTokens],
    options: ReconstructionOptions | None = None,
    *,
    reward: float = 0.0,
) -> Reconstruction:
    """Verify the episode's calls on tokens and build its rows (see the module docstring)."""
    options = options or ReconstructionOptions()
    eid = episode.episode_id
    by_id = _index(eid, receipts)
    if options.train_agents == "parent_only" and not any(
        r.agent == options.parent_agent for r in by_id.values()
    ):
        raise UnknownParentAgentError(
            eid,
            [],
            f"no call belongs to parent agent {options.parent_agent!r}",
            f"calls of agent {options.parent_agent!r} (agents: {sorted({r.agent for r in by_id.values()})})",
            "set ReconstructionOptions.parent_agent to the episode's root agent",
        )
    members = {c: r for c, r in by_id.items() if r.state in MEMBER_STATES}
    checked = {c: _check_member(eid, r) for c, r in members.items()}
    _check_tokens(eid, by_id, members, checked, tokens)
    plan = plan_forest(eid, _verify_links(eid, members, tokens))
    eligible = _eligible(members, options)
    with_loss = [e for e in plan.endpoints if _owns_any(e, plan, eligible)]
    rows = [_row(episode, e, plan, members, checked, tokens, eligible, reward) for e in with_loss]
    accounting = _account(episode, options, by_id, members, checked, plan, eligible, rows)
    return Reconstruction(rows=rows, accounting=accounting)


def _account(
    episode: EpisodeRef,
    options: ReconstructionOptions,
    by_id: Mapping[str, CallReceipt],
    members: Mapping[str, CallReceipt],
    checked: Mapping[str, _Checked],
    plan: ForestPlan,
    eligible: set[str],
    rows: list[Row],
) -> ForestAccounting:
    by_state: dict[CallState, list[str]] = {s: [] for s in CallState if s in TERMINAL_STATES}
    states: dict[str, Counter[CallState]] = {}
    calls: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for call_id, receipt in by_id.items():
        by_state[receipt.state].append(call_id)
        states.setdefault(receipt.agent, Counter())[receipt.state] += 1
        if call_id in eligible:
            calls[receipt.agent] += 1
            tokens[receipt.agent] += checked[call_id].digests.completion_len
    rows_of = Counter(members[row.spans[-1].call_id].agent for row in rows)
    per_agent = {
        agent: AgentAccounting(
            states={s: counts[s] for s in by_state},
            eligible_calls=calls[agent],
            eligible_tokens=tokens[agent],
            rows=rows_of[agent],
        )
        for agent, counts in sorted(states.items())
    }
    eligible_tokens = sum(tokens.values())
    loss_tokens = sum(r.num_loss_tokens for r in rows)
    if loss_tokens != eligible_tokens:  # ownership is a partition, so these must agree exactly
        raise LossAccountingError(
            episode.episode_id,
            sorted(eligible),
            f"rows carry {loss_tokens} loss tokens",
            f"{eligible_tokens} (each eligible token owned exactly once)",
            "report this reconstruction bug",
        )
    emitted = {r.spans[-1].call_id for r in rows}
    summaries = [c for c, r in members.items() if r.kind == CallKind.SUMMARY]  # members are sorted
    trained = [c for c in summaries if c in eligible]
    return ForestAccounting(
        episode_id=episode.episode_id,
        group_id=episode.group_id,
        options=options,
        by_state=by_state,
        members=len(members),
        verified_links=sum(1 for r in members.values() if r.parent_call_id),
        endpoints=list(plan.endpoints),
        endpoints_without_loss=[e for e in plan.endpoints if e not in emitted],
        rows=len(rows),
        eligible_calls=[c for c in by_id if c in eligible],  # by_id is sorted by call id
        eligible_tokens=eligible_tokens,
        per_agent=per_agent,
        summary_calls=summaries,
        summary_calls_trained=trained,
        summary_tokens_trained=sum(checked[c].digests.completion_len for c in trained),
    )
