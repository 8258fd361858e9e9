"""Pure pieces of a long, durable episode: ledger pages for continue-as-new, claim-checked prompts, close
digests."""

from __future__ import annotations

import pytest

from capture.claims import stash_prompt
from capture.prompt import ClaimCheckError, resolve_chat_ref
from grove.contracts import CallRequest, ChatPrompt, CloseRequest, PromptSpec, close_digest
from grove.receipts import ContextOrigin, ContextRecord, TokenDigests
from ledger.handover import LedgerPage, changed_pages, join_pages, pack_page, split_pages, unpack_page
from ledger.ledger import Ledger
from storage.local import LocalStore


def _ledger(n: int) -> Ledger:
    ledger = Ledger(episode_id="e/1", group_id="g")
    ledger.open_context(ContextRecord(context_id="parent", agent="parent", origin=ContextOrigin.ROOT))
    for i in range(n):
        call_id = f"parent.c{i}"
        digests = TokenDigests(prompt_len=3 if i == 0 else 6, completion_len=1, prompt_sha256=f"p{i}",
                               completion_sha256=f"c{i}", logprobs_sha256=f"l{i}")  # fmt: skip
        ledger.admit(call_id, "parent", extends=None if i == 0 else "parent.c0", branch=i > 0)
        ledger.complete(call_id, f"staging/e/1/{call_id}.safetensors", digests, 0, "length")
    return ledger


@pytest.mark.parametrize("n, per_page, pages", [(0, 5, 1), (4, 5, 1), (9, 5, 2), (30, 7, 5)])
def test_ledger_pages_hold_the_whole_ledger_in_order(n, per_page, pages):
    ledger = _ledger(n)
    split = split_pages(ledger, per_page)
    assert len(split) == pages
    assert all(len(p.contexts) + len(p.calls) <= per_page for p in split)
    joined = join_pages("e/1", "g", [type(p).model_validate_json(p.model_dump_json()) for p in split])
    assert joined == ledger and list(joined.calls) == list(ledger.calls)
    # the joined ledger goes on admitting where the old one stopped
    if n:
        joined.admit(f"parent.c{n}", "parent", extends="parent.c0", branch=True)


def test_incremental_pages_carry_only_what_changed_and_join_to_the_ledger():
    ledger = _ledger(10)
    first = split_pages(ledger, 4)
    restored = join_pages("e/1", "g", first)
    saved_contexts = {k: v.model_copy(deep=True) for k, v in restored.contexts.items()}
    saved_calls = dict(restored.calls)
    assert changed_pages(restored, saved_contexts, saved_calls, 4) == []
    restored.discard("parent.c3", "not used")  # an old call changes state
    restored.admit("parent.c10", "parent", extends="parent.c0", branch=True)  # a new call
    delta = changed_pages(restored, saved_contexts, saved_calls, 4)
    # a new call does not rewrite its context (pages hold no call lists: joining rebuilds them)
    assert [(list(p.contexts), list(p.calls)) for p in delta] == [([], ["parent.c3", "parent.c10"])]
    rejoined = join_pages("e/1", "g", first + delta)
    assert rejoined == restored and list(rejoined.calls) == list(restored.calls)
    assert rejoined.contexts["parent"].call_ids == [f"parent.c{i}" for i in range(11)]
    # a rewrite retires the old context: both contexts change and are written
    saved_contexts = {k: v.model_copy(deep=True) for k, v in rejoined.contexts.items()}
    rewrite = ContextRecord(
        context_id="parent-2", agent="parent", origin=ContextOrigin.REWRITE, rewrite_of="parent"
    )
    rejoined.open_context(rewrite)
    [page] = changed_pages(rejoined, saved_contexts, dict(rejoined.calls), 4)
    assert list(page.contexts) == ["parent", "parent-2"] and page.contexts["parent"].retired_by == "parent-2"
    assert join_pages("e/1", "g", first + delta + [page]) == rejoined


def test_pages_hold_no_call_lists_and_a_run_writes_only_its_own_calls():
    """Pages leave a context's call list out (it grows by every call: rewritten by every hand-over it
    would cost the square of the hand-overs), so a run's pages are its own calls, however long the
    episode; pages written with lists (older histories) still join to the same ledger."""
    ledger = _ledger(400)
    saved_contexts = {k: v.model_copy(deep=True) for k, v in ledger.contexts.items()}
    saved_calls = dict(ledger.calls)
    for page in split_pages(ledger, 1_000):
        assert all(c.call_ids == [] for c in page.contexts.values())
    for i in range(400, 410):
        ledger.admit(f"parent.c{i}", "parent", extends="parent.c0", branch=True)
    [delta] = changed_pages(ledger, saved_contexts, saved_calls, 1_000)
    assert (list(delta.contexts), len(delta.calls)) == ([], 10)
    with_lists = LedgerPage(contexts=ledger.contexts, calls=ledger.calls)  # a page as written before
    assert join_pages("e/1", "g", [with_lists]) == ledger


def test_a_packed_page_is_the_same_page_in_a_fraction_of_its_json():
    [page] = split_pages(_ledger(200), 1_000)
    packed = pack_page(page)
    assert unpack_page(packed) == page
    # what crosses Temporal for a page: at most a third of its JSON (the history bytes of a hand-over)
    assert len(packed) < len(page.model_dump_json()) / 3


def test_pages_written_before_the_close_close_to_the_workflows_accounting():
    """The workflow pages its ledger before closing it; whoever joins the pages and closes them with
    the same reason gets the receipts and accounting the workflow's own close produced."""
    ledger = _ledger(6)
    ledger.admit("parent.c6", "parent", extends="parent.c0", branch=True)  # outstanding at close
    ledger.discard("parent.c2", "not used")
    pages = split_pages(ledger, 4)
    expected = ledger.close(cancel_outstanding=True, reason="harness finished")
    joined = join_pages("e/1", "g", [unpack_page(pack_page(p)) for p in pages])
    assert joined.close(cancel_outstanding=True, reason="harness finished") == expected
    assert joined.receipts() == ledger.receipts()
    assert joined.calls["parent.c6"].state.value == "cancelled"


def test_a_stashed_chat_prompt_comes_back_only_unchanged(tmp_path):
    store = LocalStore(tmp_path)
    chat = ChatPrompt(messages=[{"role": "user", "content": "x" * 100_000}])
    call = CallRequest(call_id="parent.c0", context_id="parent", prompt=PromptSpec(chat=chat))
    stashed = stash_prompt(store, "e/1", call)
    assert stashed.prompt.chat is None and len(stashed.model_dump_json()) < 1_000
    assert resolve_chat_ref(stashed.prompt, "e/1", store).chat == chat
    with pytest.raises(ClaimCheckError, match="outside episode"):
        resolve_chat_ref(stashed.prompt, "e/2", store)
    store.put(stashed.prompt.chat_ref.key, b"{}")
    with pytest.raises(ClaimCheckError, match="was changed"):
        resolve_chat_ref(stashed.prompt, "e/1", store)


def test_close_digest_is_the_same_for_the_same_close_only():
    a = CloseRequest(final_answer="done", outputs={"parent": ["x"], "w": ["y"]})
    same = CloseRequest(final_answer="done", outputs={"w": ["y"], "parent": ["x"]})
    assert close_digest(a) == close_digest(same)
    assert close_digest(a) != close_digest(a.model_copy(update={"failure": "crashed"}))
