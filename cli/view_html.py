"""The HTML of `grove episode view` and `grove run view`: one self-contained file per page.

No network: the style and the script (cli/view_assets/) are inline, the data is embedded as JSON
(every `<` escaped, so no string in it can close the script element). The episode page renders
lazily: the call list is virtualized (only the rows in view, plus a margin, are in the DOM, so 10,000
calls cost what 50 do), and a call's tokens are rendered only when the call is opened. DOM hooks the
tests rely on: `#summary`, `#agent-tree .agent[data-agent]`, `#call-scroll .call-row[data-call]`,
`#detail`, `.tok.trained` / `.tok.conditioning` / `.tok.untrained` with `data-lp`, `#tip`,
`#rows tr[data-row]`, `#temporal-link`, and `window.groveViewReady` (milliseconds from the script's
start to the first paint of the list).
"""

from __future__ import annotations

import html
import json
from functools import cache
from pathlib import Path
from typing import Any

_EPISODE_BODY = """
<header><h1>episode {title}</h1><div id="summary" class="kv"></div></header>
<main>
<section><h2>agents and contexts</h2><div id="agent-tree"></div></section>
<section><h2>calls <span id="shown"></span></h2>
<div class="filters"><input id="q" placeholder="call or agent"><select id="state"><option value="">any state
</option><option>selected</option><option>discarded</option><option>auxiliary</option><option>failed</option>
<option>cancelled</option></select><input id="ctx-filter" type="hidden"></div>
<div id="call-scroll"><div id="call-space"></div></div></section>
<section id="detail"></section>
</main>
<div id="bottom">
<section><h2>reward and advantage per agent</h2><div id="components" style="padding:4px 8px"></div>
<table id="agents"><thead><tr><th>agent</th><th>trained</th><th>advantage</th><th>components</th></tr></thead>
<tbody></tbody></table></section>
<section><h2>rows (what the learner gets)</h2><table id="rows"><thead><tr><th>row</th><th>tokens</th>
<th>loss tokens</th><th>calls</th></tr></thead><tbody></tbody></table>
<button id="rows-more">more rows</button></section>
</div><div id="tip"></div>
"""

_RUN_BODY = """
<header><h1>run {title}</h1><div class="kv"><span>status: {status}</span><span>model: {model}</span>
<span>trains: {agents}</span>
<a id="temporal-link" href="{ui}" target="_blank">run in the Temporal UI</a></div></header>
<div style="padding:8px"><section><h2>reward per step, per role</h2><div id="chart"></div></section>
<section style="margin-top:8px"><h2>steps</h2><table id="steps"><thead><tr><th>step</th><th>mean reward</th>
<th>episodes</th><th>failed</th><th>policy</th><th>components</th><th>episodes (open one)</th></tr></thead>
<tbody></tbody></table></section></div>
"""


ASSETS = Path(__file__).with_name("view_assets")


@cache
def asset(name: str) -> str:
    """An inline asset of the pages (cli/view_assets/): the style or a page's script."""
    return (ASSETS / name).read_text(encoding="utf-8")


def _embed(data: Any) -> str:
    """JSON that is safe inside a <script> element: no `<` survives (so no `</script>`)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _page(title: str, body: str, data_id: str, data: Any, script: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{asset('view.css')}</style></head><body>{body}"
        f'<script type="application/json" id="{data_id}">{_embed(data)}</script>'
        f"<script>{script}</script></body></html>"
    )


def episode_html(view: dict[str, Any]) -> str:
    """The episode page of `view` (cli/episode_view_data.py `assemble_view`)."""
    title = view["episode"]["id"]
    body = _EPISODE_BODY.replace("{title}", html.escape(title))
    return _page(f"grove episode {title}", body, "episode-data", view, asset("episode.js"))


def run_html(run: dict[str, Any]) -> str:
    """The run page of `run` (cli/episode_view.py `gather_run`)."""
    fields = {
        "{title}": run["run_id"],
        "{status}": run["workflow_status"],
        "{model}": str(run.get("model")),
        "{agents}": str(run.get("train_agents")),
        "{ui}": run["ui"],
    }
    body = _RUN_BODY
    for key, value in fields.items():
        body = body.replace(key, html.escape(value, quote=True))
    return _page(f"grove run {run['run_id']}", body, "run-data", run, asset("run.js"))
