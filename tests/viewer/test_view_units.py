"""Pure parts of the viewer: the call archive's bytes, token marks from a row's loss mask, the embedded JSON,
and the run page in a real headless Chromium (its data built here)."""

from __future__ import annotations

import numpy as np

from capture.call_archive import build_archive, encode_archive, staged_tokens
from cli.episode_view_data import assemble_view
from cli.view_html import episode_html, run_html
from grove.receipts import CallReceipt, CallState, ContextOrigin, ContextRecord
from grove.staging_format import CallTokens
from grove.store_layout import staging_key
from storage.local import LocalStore
from tests.viewer.chromium import chromium
from trainer.rows import Row, Span


def _receipts() -> list[CallReceipt]:
    return [
        CallReceipt(call_id="lead.0.c0", context_id="lead.0", agent="lead", state=CallState.SELECTED),
        CallReceipt(call_id="lead.0.c1", context_id="lead.0", agent="lead", state=CallState.DISCARDED,
                    staging_key=staging_key("ep", "lead.0.c1")),
        CallReceipt(call_id="w.0.c0", context_id="w.0", agent="w", state=CallState.FAILED,
                    note="engine died"),
    ]  # fmt: skip


CONTEXTS = [
    ContextRecord(context_id="w.0", agent="w", origin=ContextOrigin.SPAWN, spawned_by_call="lead.0.c0"),
    ContextRecord(context_id="lead.0", agent="lead", origin=ContextOrigin.ROOT),
]


def test_the_archive_is_the_same_bytes_whatever_the_arrival_order_and_keeps_calls_without_arrays(tmp_path):
    store = LocalStore(tmp_path)
    known = {"lead.0.c0": CallTokens.of(np.arange(5), np.array([7, 8]), np.array([-0.5, -1.5]))}
    tokens_of = staged_tokens(store, known)  # lead.0.c1's staged object is gone (cleaned or lost)
    a = build_archive("ep", "g", CONTEXTS, _receipts(), tokens_of, lambda r: None)
    b = build_archive("ep", "g", CONTEXTS[::-1], _receipts()[::-1], tokens_of, lambda r: None)
    assert encode_archive(a) == encode_archive(b)
    by_id = {c.receipt.call_id: c for c in a.calls}
    assert set(by_id) == {"lead.0.c0", "lead.0.c1", "w.0.c0"}
    assert by_id["lead.0.c0"].completion_ids == [7, 8] and by_id["lead.0.c0"].logprobs == [-0.5, -1.5]
    assert by_id["lead.0.c0"].prompt_len == 5
    assert by_id["lead.0.c1"].completion_ids is None and by_id["w.0.c0"].receipt.note == "engine died"


def test_token_marks_follow_the_owning_rows_loss_mask_token_by_token(tmp_path):
    known = {"lead.0.c0": CallTokens.of(np.arange(3), np.array([7, 8, 9]), np.array([-0.1, -0.2, -0.3]))}
    archive = build_archive(
        "ep", "g", CONTEXTS, _receipts(), staged_tokens(LocalStore(tmp_path), known), lambda r: None
    )
    # the owning row trains the first two completion tokens only (positions 3, 4 of 6)
    row = Row(row_id="ep#lead.0.c0", episode_id="ep", group_id="g", input_ids=np.zeros(6, np.int32),
              loss_mask=np.array([0, 0, 0, 1, 1, 0], bool), behavior_logprobs=np.zeros(6, np.float32),
              spans=(Span("lead.0.c0", "lead", 3, 6, True, True, 0, 1.0, 1.0),), reward=1.0,
              valid=True)  # fmt: skip
    view = assemble_view(episode_id="ep", workflow_status="COMPLETED", ui_url="u", archive=archive,
                         rows=[row], result=None, timing={}, advantage=None)  # fmt: skip
    calls = {c["id"]: c for c in view["calls"]}
    assert [t[1] for t in calls["lead.0.c0"]["tokens"]] == ["trained", "trained", "conditioning"]
    assert [t[2] for t in calls["lead.0.c0"]["tokens"]] == [-0.1, -0.2, -0.3]
    assert calls["lead.0.c0"]["row"] == "ep#lead.0.c0" and calls["lead.0.c1"]["row"] is None
    assert view["contexts"][1]["spawned_by"] == "lead.0.c0"
    assert [a["name"] for a in view["agents"]] == ["lead", "w"]
    assert [a["trained"] for a in view["agents"]] == [True, False]


def test_no_message_text_can_close_the_pages_script():
    hostile = "</script><script>window.pwned = 1</script>"
    view = assemble_view(episode_id=hostile, workflow_status="RUNNING", ui_url="u", archive=None, rows=[],
                         result=None, timing={}, advantage=None)  # fmt: skip
    page = episode_html(view)
    assert page.count("</script>") == 2  # the data's and the code's own, nothing from the id


async def test_the_run_page_draws_a_curve_per_role_and_links_the_episodes_it_wrote(tmp_path):
    steps = [
        {"step": s, "mean_reward": 0.2 * s, "episodes": 2, "failed_episodes": 0, "policy_version": s - 1,
         "reward_components": {"parent": 0.1 * s, "workers": 0.3}, "episode_list": [
             {"episode_id": f"r/s{s:06d}/t0/g{j}", "page": f"r_s{s:06d}_t0_g{j}.html", "reward": 0.5,
              "failed": False, "written": s == 3, "workflow_status": "COMPLETED"} for j in range(2)]}
        for s in (1, 2, 3)
    ]  # fmt: skip
    run = {"run_id": "r", "workflow_status": "COMPLETED", "model": "tiny", "train_agents": "all",
           "ui": "http://ui.invalid/r", "steps": steps}  # fmt: skip
    page_file = tmp_path / "index.html"
    page_file.write_text(run_html(run), encoding="utf-8")
    async with chromium(tmp_path / "profile") as page:
        await page.open(page_file.as_uri())
        series = await page.js("[...document.querySelectorAll('polyline')].map(p => p.dataset.series)")
        assert series == ["mean reward", "parent", "workers"]
        assert await page.js("document.querySelectorAll('#steps tbody tr').length") == 3
        links = await page.js(
            "[...document.querySelectorAll('a.episode-link')].map(a => a.getAttribute('href'))"
        )
        assert links == ["episodes/r_s000003_t0_g0.html", "episodes/r_s000003_t0_g1.html"]
        await page.screenshot(tmp_path / "run.png")
