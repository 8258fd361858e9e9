"""`grove episode view` on an episode captured through the real stack, checked in a real headless Chromium.

Real services (the fixtures of tests/gateway/test_app_e2e.py): uvicorn serving the gateway, the Temporal
dev server, a grove worker with vLLM on the tiny model, a local store. A harness (this test, over HTTP)
drives a lead that spawns a researcher, continues with its answer, re-sends a request (its head is
discarded), makes an auxiliary call and compacts its context (a declared rewrite); a second episode of
the same group closes with another answer, so the group has two rewards. After the close, staging is
gone; the page is built from the call archive, the rows, the history and the group's results.

Checked in the browser against sources the page does not use: the engine's own record of what it served
(token counts, behaviour log-probabilities), the rows Parquet read here, and the advantage of a group of
two distinct rewards, +-1/sqrt(2) (sample std of two values). A screenshot must show the trained mark.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import openai
import pytest
from PIL import Image

from cli.episode_view import write_episode_page
from grove import queues
from grove.contracts import EpisodeSpec, HarnessSpec
from grove.sampling import SamplingConfig
from harnesses import scenario
from tests.bounds import PROCESS_WAIT, SERVICE_TEST_TIMEOUT
from tests.gateway.test_app_e2e import (  # noqa: F401  (gateway_url is a fixture)
    SYSTEM,
    assistant_of,
    close,
    gateway_url,
    oai,
)
from tests.viewer.chromium import chromium
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

ROOT = Path(__file__).resolve().parents[2]
TRAINED_RGB = (0xB8, 0xEC, 0xC6)  # the trained mark's background (cli/view_assets/view.css)


async def _start(client, run: str, j: int) -> str:
    spec = EpisodeSpec(
        run_id=run, step=1, group_id=f"{run}/t0", episode_id=f"{run}/s000001/t0/g{j}",
        task=scenario.make_task(0), harness=HarnessSpec(kind="external"),
        sampling=SamplingConfig(max_tokens=8),
    )  # fmt: skip
    await client.start_workflow("EpisodeWorkflow", spec, id=spec.episode_id, task_queue=queues.EPISODES)
    return spec.episode_id


async def _chat(client: openai.AsyncOpenAI, messages: list) -> tuple[dict, str]:
    raw = await client.chat.completions.with_raw_response.create(model="grove-tiny", messages=messages)
    return assistant_of(raw.parse().choices[0].message), raw.headers["x-grove-call-id"]


async def _drive(url: str, eid: str) -> dict[str, str]:
    """The harness's calls; returns its call ids by role."""
    lead = oai(url, eid)
    history = [SYSTEM, {"role": "user", "content": "Ask the researcher, then answer."}]
    reply, spawner = await _chat(lead, history)
    researcher = oai(url, eid, **{"x-grove-agent": "researcher", "x-grove-spawned-by": spawner})
    answer, worker_call = await _chat(researcher, [SYSTEM, {"role": "user", "content": "Find the word."}])
    history += [reply, {"role": "user", "content": f"researcher says: {answer['content']}"}]
    _, first_try = await _chat(lead, history)
    reply, retried = await _chat(lead, history)  # the same request again: a retry, its head discarded
    aux = oai(url, eid, **{"x-grove-call-kind": "auxiliary"})
    _, aux_call = await _chat(aux, [{"role": "user", "content": "Title: a research task."}])
    rewrite = oai(url, eid, **{"x-grove-rewrite": "1"})
    _, compacted = await _chat(rewrite, [SYSTEM, {"role": "user", "content": "Summary: asked. Answer now."}])
    return {"spawner": spawner, "worker": worker_call, "discarded": first_try, "retry": retried,
            "aux": aux_call, "rewrite": compacted}  # fmt: skip


async def test_a_captured_episode_shows_its_tree_calls_tokens_rows_and_advantage_in_chromium(
    gateway_url,  # noqa: F811
    temporal_server,
    temporal_client,
    recording_engine,
    e2e_store,
    tiny_model_dir,
    tmp_path,
):
    run = f"gw-view-{uuid.uuid4().hex[:6]}"
    eid, other = await _start(temporal_client, run, 0), await _start(temporal_client, run, 1)
    ids = await _drive(gateway_url, eid)
    await _chat(oai(gateway_url, other), [SYSTEM, {"role": "user", "content": "Answer."}])
    assert (await close(gateway_url, eid, {"final_answer": "alpha"}, wait=True)).status_code == 200
    assert (await close(gateway_url, other, {"final_answer": "omega"}, wait=True)).status_code == 200
    assert not e2e_store.list(f"staging/{eid}/")  # the page cannot read staging: it is gone

    out = tmp_path / "episode.html"
    view = await write_episode_page(temporal_client, e2e_store, eid, out, str(tiny_model_dir))
    served = recording_engine.calls_of(eid)
    rows = rows_from_parquet(e2e_store.get(view["episode"]["rows_key"]))

    async with chromium(tmp_path / "profile") as page:
        await page.open(out.as_uri())
        await page.js(
            "new Promise(r => { const t = () => window.groveViewReady ? r(1)"
            " : requestAnimationFrame(t); t(); })"
        )
        # the tree: agents as the harness named them, the spawn link, the rewrite
        agents = await page.js(
            "[...document.querySelectorAll('#agent-tree .agent')].map(a => a.dataset.agent)"
        )
        assert set(agents) == {"parent", "researcher", "parent~aux"}
        spawn = await page.js(
            "document.querySelector('.ctx[data-context=\"researcher.0\"] .link').dataset.goto"
        )
        assert spawn == ids["spawner"]
        old = await page.js("document.querySelector('.ctx[data-context=\"parent.0\"]').textContent")
        assert "retired by parent.1" in old
        assert "rewrite of parent.0" in await page.js(
            "document.querySelector('.ctx[data-context=\"parent.1\"]').textContent"
        )
        # every call the engine served is listed, with its state
        listed = await page.js(
            "Object.fromEntries([...document.querySelectorAll('.call-row')]"
            ".map(r => [r.dataset.call, r.querySelector('.st').textContent]))"
        )
        assert set(listed) == set(served)
        assert listed[ids["discarded"]] == "discarded" and listed[ids["aux"]] == "auxiliary"
        assert listed[ids["worker"]] == "selected"

        # the researcher's call: its tokens as the engine sampled them, trained, log-probabilities on hover
        await page.js(f"document.querySelector('.call-row[data-call=\"{ids['worker']}\"]').click()")
        worker = served[ids["worker"]]
        toks = await page.js(
            "[...document.querySelectorAll('#completion .tok')].map(t => [t.className, t.dataset.lp])"
        )
        assert len(toks) == worker.completion_ids.size
        assert {cls for cls, _ in toks} == {"tok trained"}
        assert [float(lp) for _, lp in toks] == pytest.approx(worker.logprobs.tolist(), abs=1e-3)
        x, y = await page.js(
            "(b => [b.x + 2, b.y + 4])(document.querySelector('#completion .tok').getBoundingClientRect())"
        )
        await page.mouse_move(x, y)
        tip = await page.js(
            "(t => [getComputedStyle(t).display, t.textContent])(document.getElementById('tip'))"
        )
        assert tip[0] == "block" and tip[1].startswith(f"logprob {toks[0][1]}")
        shot = await page.screenshot(tmp_path / "episode.png")

        # the discarded try and the auxiliary leaf (no loss: it makes no row) are in no row
        for call in (ids["discarded"], ids["aux"]):
            await page.js(f"document.querySelector('.call-row[data-call=\"{call}\"]').click()")
            marks = await page.js("[...document.querySelectorAll('#completion .tok')].map(t => t.className)")
            assert set(marks) == {"tok untrained"} and len(marks) == served[call].completion_ids.size
            assert "in no row" in await page.js("document.getElementById('detail').textContent")
        # the timing comes from the workflow history
        assert "scheduled 20" in await page.js("document.getElementById('detail').textContent")

        # rows as the learner gets them, with their loss tokens
        shown_rows = await page.js(
            "[...document.querySelectorAll('#rows tbody tr')]"
            ".map(r => [r.dataset.row, r.children[2].textContent])"
        )
        assert shown_rows == [[r.row_id, str(r.num_loss_tokens)] for r in rows]
        # a group of two distinct rewards: A = +-(1/sqrt 2) with std scaling; the Temporal UI link
        adv = await page.js("document.querySelector('#summary [data-k=advantage]').textContent")
        assert abs(abs(float(adv.split(": ")[1])) - 1 / math.sqrt(2)) < 1e-3, adv
        href = await page.js("document.getElementById('temporal-link').href")
        assert href.endswith(f"/namespaces/default/workflows/{quote(eid, safe='')}")

    # the command writes the same page; an unknown episode exits 4 naming it
    env = os.environ | {"GROVE_STORE": str(e2e_store.root), "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "cli.main", "episode", "view", "--address", temporal_server.address]
    done = subprocess.run([*base, eid, "--out", str(tmp_path / "cli.html"), "--model", str(tiny_model_dir)],
                          env=env, capture_output=True, text=True, timeout=PROCESS_WAIT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cli.html").read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    missing = subprocess.run([*base, f"{run}/s000001/t0/g9"], env=env, capture_output=True, text=True,
                             timeout=PROCESS_WAIT)  # fmt: skip
    assert missing.returncode == 4 and f"{run}/s000001/t0/g9" in missing.stderr

    image = Image.open(io.BytesIO(shot)).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    assert image.size[0] == 1500  # the window's width (its height less the headless frame)
    assert any(rgb == TRAINED_RGB for _, rgb in colors), "no trained token visible in the screenshot"
