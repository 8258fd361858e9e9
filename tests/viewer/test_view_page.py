"""The episode page in a real headless Chromium on a large episode: 2,400 calls load without freezing.

The episode is built (not captured: a captured one is in test_episode_view_e2e.py) so that its size is
what the test says: 40 agents of 60 calls, each call with 24 completion tokens. The page must paint
its first rows within a bound, keep the DOM small (virtualized list), reach the last call by
scrolling, and open it on a click. The time to first paint is printed (docs/results.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from capture.call_archive import ArchivedCall, CallArchive
from cli.episode_view_data import assemble_view
from cli.view_html import episode_html
from grove.receipts import CallReceipt, CallState, ContextOrigin, ContextRecord
from grove.sampling import SamplingProcessing
from tests.viewer.chromium import chromium
from trainer.rows import Row, Span

pytestmark = pytest.mark.timeout(600)

AGENTS, CALLS, TOKENS = 40, 60, 24
FIRST_PAINT_BOUND_MS = 5000.0  # a frozen page takes tens of seconds for 2,400 calls rendered whole


def _episode() -> tuple[CallArchive, list[Row]]:
    contexts = [ContextRecord(context_id="lead.0", agent="lead", origin=ContextOrigin.ROOT)]
    calls, rows = [], []
    for a in range(AGENTS):
        agent = "lead" if a == 0 else f"w{a}"
        if a:
            contexts.append(
                ContextRecord(context_id=f"{agent}.0", agent=agent, origin=ContextOrigin.SPAWN,
                              spawned_by_call="lead.0.c0")
            )  # fmt: skip
        for c in range(CALLS):
            state = CallState.DISCARDED if c % 10 == 9 else CallState.SELECTED
            receipt = CallReceipt(
                call_id=f"{agent}.0.c{c}", context_id=f"{agent}.0", agent=agent, state=state,
                parent_call_id=f"{agent}.0.c{c - 1}" if c else None, policy_version=3,
                sampling=SamplingProcessing(temperature=1.0, top_p=1.0),
            )  # fmt: skip
            calls.append(
                ArchivedCall(receipt=receipt, prompt_len=50, prompt_tail_ids=list(range(8)),
                             completion_ids=list(range(100, 100 + TOKENS)), logprobs=[-0.5] * TOKENS)
            )  # fmt: skip
        trained = a < AGENTS - 1  # the last agent is not trained: its row is only conditioning
        span = Span(f"{agent}.0.c0", agent, 1, 1 + TOKENS, trained, trained, 3, 1.0, 1.0)
        rows.append(
            Row(row_id=f"ep#{agent}", episode_id="ep", group_id="g",
                input_ids=np.zeros(1 + TOKENS, np.int32), loss_mask=np.r_[False, [trained] * TOKENS],
                behavior_logprobs=np.zeros(1 + TOKENS, np.float32), spans=(span,), reward=0.5, valid=True)
        )  # fmt: skip
    return CallArchive(episode_id="ep", group_id="g", contexts=contexts, calls=calls), rows


async def test_a_page_of_2400_calls_paints_fast_keeps_the_dom_small_and_reaches_the_last_call(tmp_path):
    archive, rows = _episode()
    view = assemble_view(
        episode_id="big/s000001/t0/g0", workflow_status="COMPLETED", ui_url="http://ui.invalid/x",
        archive=archive, rows=rows, result=None, timing={}, advantage=None,
    )  # fmt: skip
    page_file = tmp_path / "big.html"
    page_file.write_text(episode_html(view), encoding="utf-8")
    async with chromium(tmp_path / "profile") as page:
        await page.open(page_file.as_uri())
        ready = await page.js(
            "new Promise(r => { const t = () => window.groveViewReady ? r(window.groveViewReady)"
            " : requestAnimationFrame(t); t(); })"
        )
        print(f"\n2,400-call page: first paint {ready:.0f} ms after the script started")
        assert ready < FIRST_PAINT_BOUND_MS
        in_dom = await page.js("document.querySelectorAll('.call-row').length")
        assert 10 < in_dom < 120, in_dom  # only what is in view, plus margins
        assert await page.js("document.getElementById('shown').textContent") == "2400 calls"
        last = f"w{AGENTS - 1}.0.c{CALLS - 1}"
        await page.js(
            "(() => { const s = document.getElementById('call-scroll'); s.scrollTop = s.scrollHeight; "
            "s.dispatchEvent(new Event('scroll')); })()"
        )
        box = await page.js(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => {"
            f" const e = document.querySelector('.call-row[data-call=\"{last}\"]');"
            " r(e && (b => [b.x + 20, b.y + 10])(e.getBoundingClientRect())); })))"
        )
        assert box, f"{last} not rendered after scrolling to the bottom"
        await page.click(*box)
        assert await page.js("document.querySelector('#detail h2').textContent") == f"call {last}"
        marks = await page.js("[...document.querySelectorAll('#completion .tok')].map(t => t.className)")
        assert marks == ["tok untrained"] * TOKENS  # discarded: in no row
        # a call in a row without loss (an agent the run does not train): conditioning
        marks = await page.js(
            "(() => { const s = document.getElementById('call-scroll');"
            f" s.scrollTop = ({AGENTS * CALLS - CALLS}) * 26; "
            "s.dispatchEvent(new Event('scroll')); return new Promise(r => requestAnimationFrame(() => {"
            f" document.querySelector('.call-row[data-call=\"w{AGENTS - 1}.0.c0\"]').click();"
            " r([...document.querySelectorAll('#completion .tok')].map(t => t.className)); })); })()"
        )
        assert marks == ["tok conditioning"] * TOKENS
        # the filter narrows the list to one agent's context through the tree
        await page.js("document.querySelector('.ctx[data-context=\"w7.0\"]').click()")
        assert await page.js("document.getElementById('shown').textContent") == f"{CALLS} calls"
