"""Property-based tests: random forests of contexts, random admission/completion orders.

A random episode spec (parent + workers, compactions, branches, discarded retries, auxiliary calls,
failed, cancelled and outstanding calls) is played through a real Ledger in two random valid event
orders, closed, and reconstructed. Expectations come from the spec itself (which calls are eligible,
what each call's prompt and completion are), never from the code under test.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from grove.receipts import AUXILIARY_KINDS, CallKind, CallState, ContextOrigin, ContextRecord
from grove.sampling import SamplingProcessing
from grove.staging_format import CallTokens
from grove.store_layout import staging_key
from ledger.ledger import Ledger
from trainer.forest import EpisodeRef, ReconstructionOptions, reconstruct
from trainer.rows import rows_to_parquet

SAMPLED = SamplingProcessing(temperature=1.0, top_p=1.0)

OUTCOMES = ("selected", "discarded", "failed", "cancelled", "outstanding")


@dataclass(frozen=True)
class CallSpec:
    call_id: str
    context_id: str
    agent: str
    parent: str | None
    kind: CallKind
    outcome: str
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def kept(self) -> bool:  # the harness used it: SELECTED or AUXILIARY at close
        return self.outcome == "selected"


@dataclass(frozen=True)
class Spec:
    contexts: tuple[ContextRecord, ...]
    calls: tuple[CallSpec, ...]


ids_ = st.lists(st.integers(0, 50_000), min_size=1, max_size=4)


@st.composite
def context_calls(draw, context_id: str, agent: str, counter: list[int]) -> list[CallSpec]:
    """A tree of calls in one context: a kept root, then children of random kept calls."""
    calls: list[CallSpec] = []
    for i in range(draw(st.integers(1, 6))):
        kept = [c for c in calls if c.kept]
        parent = None if i == 0 else draw(st.sampled_from(kept))
        outcome = "selected" if i == 0 else draw(st.sampled_from(OUTCOMES))
        prompt = (
            tuple(draw(ids_)) if parent is None else parent.prompt + parent.completion + tuple(draw(ids_))
        )
        completion = tuple(draw(st.lists(st.integers(0, 50_000), max_size=3)))
        counter[0] += 1
        calls.append(
            CallSpec(
                call_id=f"k{counter[0]:03d}",
                context_id=context_id,
                agent=agent,
                parent=None if parent is None else parent.call_id,
                kind=draw(st.sampled_from([CallKind.ACTION, CallKind.ACTION, *AUXILIARY_KINDS])),
                outcome=outcome,
                prompt=prompt,
                completion=completion,
                logprobs=tuple(-(counter[0] + j / 10) for j in range(len(completion))),
            )
        )
    return calls


@st.composite
def episodes(draw) -> Spec:
    counter = [0]
    contexts: list[ContextRecord] = []
    calls: list[CallSpec] = []
    for agent in ["parent"] + [f"worker-{i}" for i in range(draw(st.integers(0, 3)))]:
        spawner = None
        if agent != "parent":
            spawner = draw(st.sampled_from([c.call_id for c in calls if c.agent == "parent" and c.kept]))
        previous = None
        for segment in range(draw(st.integers(1, 3))):  # segments > 0 are compactions
            cid = f"{agent}/{segment}"
            if previous is not None:
                record = ContextRecord(
                    context_id=cid, agent=agent, origin=ContextOrigin.REWRITE, rewrite_of=previous
                )
            elif spawner is not None:
                record = ContextRecord(
                    context_id=cid, agent=agent, origin=ContextOrigin.SPAWN, spawned_by_call=spawner
                )
            else:
                record = ContextRecord(context_id=cid, agent=agent, origin=ContextOrigin.ROOT)
            contexts.append(record)
            calls += draw(context_calls(cid, agent, counter))
            previous = cid
    return Spec(contexts=tuple(contexts), calls=tuple(calls))


def arrays(call: CallSpec) -> CallTokens:
    return CallTokens.of(list(call.prompt), list(call.completion), list(call.logprobs))


def play(spec: Spec, seed: int) -> Ledger:
    """Run the spec through a real ledger, picking a random enabled event at every step."""
    rng = random.Random(seed)
    ledger = Ledger(episode_id="ep", group_id="grp")
    by_id = {c.call_id: c for c in spec.calls}
    todo_open = list(spec.contexts)
    todo_calls = list(spec.calls)

    def opened(cid: str) -> bool:
        return cid in ledger.contexts

    def state(call_id: str) -> CallState | None:
        receipt = ledger.calls.get(call_id)
        return None if receipt is None else receipt.state

    def can_open(rec: ContextRecord) -> bool:
        if rec.origin == ContextOrigin.SPAWN:
            return state(rec.spawned_by_call) is not None
        if rec.origin == ContextOrigin.REWRITE:
            return opened(rec.rewrite_of) and all(
                state(c.call_id) is not None for c in spec.calls if c.context_id == rec.rewrite_of
            )
        return True

    def next_step(call: CallSpec):
        s = state(call.call_id)
        if s is None:
            if opened(call.context_id) and (call.parent is None or state(call.parent) == CallState.COMPLETED):
                return "admit"
        elif s == CallState.ADMITTED:
            return {
                "selected": "complete",
                "discarded": "complete",
                "failed": "fail",
                "cancelled": "cancel",
            }.get(call.outcome)
        elif s == CallState.COMPLETED and call.outcome == "discarded":
            return "discard"
        return None

    while True:
        events = [("open", r) for r in todo_open if can_open(r)]
        events += [(step, c) for c in todo_calls if (step := next_step(c))]
        if not events:
            break
        kind, item = rng.choice(events)
        if kind == "open":
            ledger.open_context(item)
            todo_open.remove(item)
        elif kind == "admit":
            branch = item.parent is not None and item.parent != ledger.head(item.context_id)
            ledger.admit(item.call_id, item.context_id, kind=item.kind, extends=item.parent, branch=branch)
        elif kind == "complete":
            a = arrays(item)
            key = staging_key("ep", item.call_id)
            ledger.complete(item.call_id, key, a.digests(), 7, "stop", sampling=SAMPLED)
        elif kind == "discard":
            ledger.discard(item.call_id, "retry")
        elif kind == "fail":
            ledger.fail(item.call_id, "engine error")
        else:
            ledger.cancel(item.call_id, "abandoned")
    assert not todo_open and all(c.call_id in ledger.calls for c in spec.calls), "the player deadlocked"
    assert by_id  # every spec has at least the parent's root call
    return ledger


def eligible_calls(spec: Spec, options: ReconstructionOptions) -> set[str]:
    return {
        c.call_id
        for c in spec.calls
        if c.kept
        and (c.kind == CallKind.ACTION or c.kind.value in options.train_auxiliary)
        and (options.train_agents == "all" or c.agent == "parent")
    }


options_ = st.builds(
    ReconstructionOptions,
    train_agents=st.sampled_from(["all", "parent_only"]),
    train_auxiliary=st.sampled_from([[], ["summary"]]),
)


@settings(max_examples=150, deadline=None)
@given(spec=episodes(), seeds=st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)), options=options_)
def test_any_admission_and_completion_order_gives_identical_rows(spec, seeds, options):
    results = []
    for seed in seeds:
        ledger = play(spec, seed)
        ledger.close(cancel_outstanding=True)
        staged = {c.call_id: arrays(c) for c in spec.calls if c.kept}
        results.append(
            reconstruct(EpisodeRef(episode_id="ep", group_id="grp"), ledger.receipts(), staged, options)
        )
    first, second = results
    assert rows_to_parquet(first.rows) == rows_to_parquet(second.rows)
    assert first.accounting == second.accounting


@settings(max_examples=150, deadline=None)
@given(spec=episodes(), seed=st.integers(0, 2**32))
def test_ledger_accounting_is_always_complete_and_matches_the_outcomes(spec, seed):
    ledger = play(spec, seed)
    acc = ledger.close(cancel_outstanding=True)
    expected = {
        ("selected", CallKind.ACTION): CallState.SELECTED,
        ("selected", CallKind.AUXILIARY): CallState.AUXILIARY,
        ("selected", CallKind.SUMMARY): CallState.AUXILIARY,
        ("selected", CallKind.TITLE): CallState.AUXILIARY,
    }
    other = {
        "discarded": CallState.DISCARDED,
        "failed": CallState.FAILED,
        "cancelled": CallState.CANCELLED,
        "outstanding": CallState.CANCELLED,
    }
    want: dict[CallState, list[str]] = {s: [] for s in CallState}
    for c in spec.calls:
        want[expected.get((c.outcome, c.kind)) or other[c.outcome]].append(c.call_id)
    assert acc.by_state == {s: sorted(v) for s, v in want.items()}
    assert acc.cancelled_at_close == sorted(c.call_id for c in spec.calls if c.outcome == "outstanding")
    assert sorted(acc.admitted) == sorted(c.call_id for c in spec.calls)


@settings(max_examples=150, deadline=None)
@given(spec=episodes(), seed=st.integers(0, 2**32), options=options_)
def test_every_eligible_action_is_owned_once_under_its_exact_context(spec, seed, options):
    ledger = play(spec, seed)
    ledger.close(cancel_outstanding=True)
    staged = {c.call_id: arrays(c) for c in spec.calls if c.kept}
    rows = reconstruct(EpisodeRef(episode_id="ep", group_id="grp"), ledger.receipts(), staged, options).rows
    by_id = {c.call_id: c for c in spec.calls}
    eligible = eligible_calls(spec, options)

    owned = Counter(s.call_id for r in rows for s in r.spans if s.owned)
    assert owned == Counter(eligible)  # every eligible call exactly once, nothing else

    kept_children = {c.parent for c in spec.calls if c.kept and c.parent}
    for row in rows:
        endpoint = by_id[row.spans[-1].call_id]
        assert endpoint.kept and endpoint.call_id not in kept_children
        assert row.input_ids.tolist() == list(endpoint.prompt + endpoint.completion)
        expected_mask = np.zeros(row.input_ids.size, dtype=bool)
        for span in row.spans:
            call = by_id[span.call_id]
            # exact conditioning: everything before the completion is exactly the call's prompt
            assert row.input_ids[: span.start].tolist() == list(call.prompt)
            assert row.input_ids[span.start : span.end].tolist() == list(call.completion)
            assert span.eligible == (span.call_id in eligible)
            if span.owned:
                expected_mask[span.start : span.end] = True
                np.testing.assert_array_equal(
                    row.behavior_logprobs[span.start : span.end], np.asarray(call.logprobs, dtype=np.float32)
                )
        assert row.loss_mask.tolist() == expected_mask.tolist()  # masked tokens never carry loss
        assert not row.behavior_logprobs[~row.loss_mask].any()
    assert sum(r.num_loss_tokens for r in rows) == sum(len(by_id[c].completion) for c in eligible)
