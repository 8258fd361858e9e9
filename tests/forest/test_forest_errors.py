"""Each reconstruction failure has its own error class, naming the episode, the calls and the fix."""

from __future__ import annotations

import pytest

from grove.receipts import CallKind, CallReceipt, CallState
from tests.forest.kit import Episode, tokens
from trainer.forest import (
    CrossContextLinkError,
    DuplicateReceiptError,
    EmptyPromptError,
    EpisodeRef,
    ForeignTokensError,
    InconsistentReceiptError,
    MissingSelectedPredecessorError,
    MissingTokensError,
    ParentLinkMismatchError,
    ReconstructionOptions,
    TokenDigestMismatchError,
    UnknownParentAgentError,
    UnsettledCallError,
    reconstruct,
)
from trainer.ownership import CyclicAncestryError

REF = EpisodeRef(episode_id="ep", group_id="grp")


def two_calls(second_prompt: list[int] | None = None) -> Episode:
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3, 4], [-1, -2]))
    ep.call("c2", "a", tokens(second_prompt or [1, 2, 3, 4, 5], [6], [-3]), extends="c1")
    ep.close()
    return ep


def replaced(receipts: list[CallReceipt], call_id: str, **update) -> list[CallReceipt]:
    return [r.model_copy(update=update) if r.call_id == call_id else r for r in receipts]


def test_selected_call_whose_predecessor_is_not_selected_is_an_error():
    ep = two_calls()
    receipts = replaced(ep.ledger.receipts(), "c1", state=CallState.DISCARDED)
    with pytest.raises(MissingSelectedPredecessorError) as err:
        reconstruct(REF, receipts, ep.staged)
    assert err.value.call_ids == ["c2", "c1"] and err.value.episode_id == "ep"
    assert "'c1', which is not selected" in str(err.value)


def test_parent_link_mismatch_names_the_first_differing_position():
    ep = two_calls(second_prompt=[1, 2, 3, 99, 5])
    with pytest.raises(ParentLinkMismatchError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["c2", "c1"]
    assert "first at position 3" in str(err.value) and "REWRITE" in str(err.value)


def test_prompt_difference_inside_the_parent_prompt_is_caught_too():
    ep = two_calls(second_prompt=[7, 2, 3, 4, 5])
    with pytest.raises(ParentLinkMismatchError, match="first at position 0"):
        ep.reconstruct()


def test_staged_arrays_that_do_not_match_the_receipt_are_rejected():
    ep = two_calls()
    ep.staged["c1"] = tokens([1, 2], [3, 4], [-1, -2.5])
    with pytest.raises(TokenDigestMismatchError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["c1"] and "['logprobs_sha256']" in str(err.value)


def test_missing_staged_arrays_of_a_member_are_an_error():
    ep = two_calls()
    del ep.staged["c1"]
    with pytest.raises(MissingTokensError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["c1"]


def test_staged_arrays_of_an_unknown_call_are_an_error():
    ep = two_calls()
    ep.staged["zz"] = tokens([1], [2], [-1])
    with pytest.raises(ForeignTokensError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["zz"]


def test_duplicate_receipts_are_an_error():
    ep = two_calls()
    receipts = ep.ledger.receipts()
    with pytest.raises(DuplicateReceiptError) as err:
        reconstruct(REF, receipts + receipts[:1], ep.staged)
    assert err.value.call_ids == ["c1"]


def test_reconstructing_an_open_ledger_is_an_error():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1], [2], [-1]))
    ep.admit("c2", "a", "c1")
    with pytest.raises(UnsettledCallError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["c1", "c2"] and "close the episode's ledger" in str(err.value)


def test_link_across_contexts_is_an_error():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([1, 2], [3], [-1]))
    ep.spawn("b", "worker-1", by="c1")
    ep.call("w1", "b", tokens([1, 2, 3, 4], [5], [-2]))
    ep.close()
    receipts = replaced(ep.ledger.receipts(), "w1", parent_call_id="c1")
    with pytest.raises(CrossContextLinkError) as err:
        reconstruct(REF, receipts, ep.staged)
    assert err.value.call_ids == ["w1", "c1"]


def test_cyclic_parent_links_are_an_error():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("x", "a", tokens([1], [], []))
    ep.call("y", "a", tokens([1], [], []), extends="x")
    ep.close()
    receipts = replaced(ep.ledger.receipts(), "x", parent_call_id="y")
    with pytest.raises(CyclicAncestryError) as err:
        reconstruct(REF, receipts, ep.staged)
    assert sorted(err.value.call_ids) == ["x", "y"]


def test_empty_prompt_is_an_error():
    ep = Episode()
    ep.root("a", "parent")
    ep.call("c1", "a", tokens([], [5], [-1]))
    ep.close()
    with pytest.raises(EmptyPromptError) as err:
        ep.reconstruct()
    assert err.value.call_ids == ["c1"]


def test_parent_only_with_an_unknown_parent_agent_is_an_error():
    ep = two_calls()
    with pytest.raises(UnknownParentAgentError, match="'boss'"):
        ep.reconstruct(ReconstructionOptions(train_agents="parent_only", parent_agent="boss"))


def test_selected_receipt_of_auxiliary_kind_is_inconsistent():
    ep = two_calls()
    receipts = replaced(ep.ledger.receipts(), "c2", kind=CallKind.AUXILIARY)
    with pytest.raises(InconsistentReceiptError) as err:
        reconstruct(REF, receipts, ep.staged)
    assert err.value.call_ids == ["c2"]


def test_selected_receipt_without_digests_is_inconsistent():
    ep = two_calls()
    receipts = replaced(ep.ledger.receipts(), "c1", digests=None)
    with pytest.raises(InconsistentReceiptError):
        reconstruct(REF, receipts, ep.staged)
