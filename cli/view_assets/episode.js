const T0 = performance.now();
const D = JSON.parse(document.getElementById('episode-data').textContent);
const $ = (s) => document.querySelector(s);
const el = (tag, attrs = {}, text) => { const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text; return e; };
const fmt = (x, d = 3) => (x === null || x === undefined) ? '-' : (typeof x === 'number' ? x.toFixed(d) : String(x));
const byId = new Map(D.calls.map((c, i) => [c.id, i]));
let shown = D.calls.map((_, i) => i), selected = null;
const ROW = 26, MARGIN = 10;

function summary() {
  const e = D.episode, s = $('#summary');
  const parts = [['status', `${e.workflow_status} / ${e.status ?? 'running'}`], ['reward', fmt(e.reward)],
    ['advantage', D.advantage ? fmt(D.advantage.value) : '-'], ['calls', D.calls.length],
    ['counts', Object.entries(e.counts).map(([k, v]) => `${k} ${v}`).join(', ') || '-'],
    ['rows', D.rows.length], ['policy versions', e.policy_versions.join(', ') || '-']];
  for (const [k, v] of parts) s.append(el('span', {'data-k': k}, `${k}: ${v}`));
  if (e.failure) s.append(el('span', {class: 'bad'}, `failure (${e.failure_kind}): ${e.failure}`));
  if (!e.archived) s.append(el('span', {class: 'bad'},
    'no call archive: the episode is running or was materialized before archives'));
  const a = el('a', {id: 'temporal-link', href: e.ui, target: '_blank'}, 'workflow in the Temporal UI');
  s.append(a);
}

function tree() {
  const box = $('#agent-tree');
  for (const a of D.agents) {
    const div = el('div', {class: 'agent', 'data-agent': a.name});
    div.append(el('b', {}, a.name), el('span', {}, `  ${a.calls} calls${a.trained ? ', trained' : ', not trained'}`));
    for (const cid of a.contexts) {
      const c = D.contexts.find((x) => x.id === cid), row = el('div', {class: 'ctx', 'data-context': cid});
      row.append(el('span', {}, `${cid} · ${c.origin}`));
      if (c.spawned_by) { row.append(' spawned by '); row.append(callLink(c.spawned_by)); }
      if (c.rewrite_of) row.append(` · rewrite of ${c.rewrite_of}`);
      if (c.retired_by) row.append(` · retired by ${c.retired_by}`);
      row.addEventListener('click', (ev) => { if (ev.target.classList.contains('link')) return;
        const on = !row.classList.contains('on');
        document.querySelectorAll('.ctx.on').forEach((x) => x.classList.remove('on'));
        if (on) row.classList.add('on'); $('#ctx-filter').value = on ? cid : ''; filter(); });
      div.append(row);
    }
    box.append(div);
  }
}

function callLink(id) { const a = el('span', {class: 'link', 'data-goto': id}, id);
  a.addEventListener('click', () => open(id, true)); return a; }

function filter() {
  const q = $('#q').value.trim(), st = $('#state').value, ctx = $('#ctx-filter').value;
  shown = [];
  D.calls.forEach((c, i) => { if ((!st || c.state === st) && (!ctx || c.context === ctx) &&
    (!q || c.id.includes(q) || c.agent.includes(q))) shown.push(i); });
  $('#call-space').style.height = `${shown.length * ROW}px`; $('#shown').textContent = `${shown.length} calls`;
  paint();
}

function paint() {
  const sc = $('#call-scroll'), first = Math.max(0, Math.floor(sc.scrollTop / ROW) - MARGIN);
  const last = Math.min(shown.length, Math.ceil((sc.scrollTop + sc.clientHeight) / ROW) + MARGIN);
  const space = $('#call-space'); space.replaceChildren();
  for (let k = first; k < last; k++) {
    const c = D.calls[shown[k]], r = el('div', {class: 'call-row' + (c.id === selected ? ' on' : ''),
      'data-call': c.id, style: `top:${k * ROW}px`});
    r.append(el('span', {class: 'id'}, c.id), el('span', {class: `st st-${c.state}`}, c.state),
      el('span', {}, `v${c.version ?? '-'}`), el('span', {}, `${c.tokens.length} tok`),
      el('span', {}, c.timing && c.timing.total_ms !== null ? `${c.timing.total_ms} ms` : ''));
    r.addEventListener('click', () => open(c.id, false)); space.append(r);
  }
}

function dl(pairs) { const d = el('dl'); for (const [k, v] of pairs) {
  const dd = el('dd'); if (v instanceof Node) dd.append(v); else dd.textContent = v ?? '-';
  d.append(el('dt', {}, k), dd); } return d; }

function open(id, scroll) {
  const i = byId.get(id); if (i === undefined) return; const c = D.calls[i]; selected = id;
  const box = $('#detail'); box.replaceChildren(el('h2', {}, `call ${c.id}`));
  const t = c.timing || {};
  box.append(dl([['state', c.state], ['kind', c.kind], ['agent / context', `${c.agent} / ${c.context}`],
    ['continues', c.parent ? callLink(c.parent) : 'nothing (a context root)'], ['policy version', c.version],
    ['sampling', `temperature ${fmt(c.temperature, 2)}, top_p ${fmt(c.top_p, 2)}`], ['finish', c.finish],
    ['note', c.note], ['tool call', c.tool_call], ['prompt tokens', c.prompt_len],
    ['timing', t.scheduled ? `scheduled ${t.scheduled}, queued ${t.queue_ms} ms, ran ${t.run_ms} ms, ` +
      `${t.attempts} attempt(s), ${t.outcome}` : '-'],
    ['row', c.row || 'in no row'], ['launch / session', `${c.launch ?? '-'} / ${c.session ?? '-'}`]]));
  box.append(el('h3', {}, 'request (last messages)'));
  for (const m of c.messages) box.append(el('pre', {class: 'msg'}, m));
  box.append(el('h3', {}, 'prompt tail (tokens)'), el('pre', {class: 'prompt-tail'}, c.prompt_tail || '-'));
  box.append(el('h3', {}, 'completion'), legend());
  const toks = el('div', {class: 'tokens', id: 'completion'});
  for (const [text, mark, lp] of c.tokens) toks.append(el('span', {class: `tok ${mark}`,
    'data-lp': lp === null ? '' : String(lp)}, text));
  box.append(toks);
  if (c.response) box.append(el('h3', {}, 'response as delivered'), el('pre', {}, c.response));
  if (scroll) { const k = shown.indexOf(i);
    if (k < 0) { $('#q').value = ''; $('#state').value = ''; $('#ctx-filter').value = ''; filter(); }
    $('#call-scroll').scrollTop = Math.max(0, shown.indexOf(i) * ROW - 60); }
  paint();
}

function legend() { const l = el('div', {class: 'legend'});
  for (const m of ['trained', 'conditioning', 'untrained']) l.append(el('span', {class: `tok ${m}`}, m));
  l.append(el('span', {}, 'hover a token: its behaviour log-probability')); return l; }

function tip() { const t = $('#tip');
  document.addEventListener('mouseover', (ev) => { const s = ev.target;
    if (!s.classList || !s.classList.contains('tok') || !s.hasAttribute('data-lp')) { t.style.display = 'none'; return; }
    const lp = s.getAttribute('data-lp');
    t.textContent = lp === '' ? 'no log-probability recorded' : `logprob ${lp}  p=${Math.exp(+lp).toFixed(3)}`;
    t.style.left = `${ev.clientX + 10}px`; t.style.top = `${ev.clientY + 12}px`; t.style.display = 'block'; }); }

function tables() {
  const at = $('#agents tbody');
  for (const a of D.agents) { const tr = el('tr', {'data-agent': a.name});
    tr.append(el('td', {}, a.name), el('td', {}, a.trained ? 'yes' : 'no'),
      el('td', {}, a.advantage === null ? '-' : fmt(a.advantage)),
      el('td', {}, Object.entries(a.components).map(([k, v]) => `${k} ${fmt(v)}`).join(', ') || '-'));
    at.append(tr); }
  const comps = Object.entries(D.episode.components).map(([k, v]) => `${k} ${fmt(v)}`).join(', ');
  $('#components').textContent = `reward components: ${comps || '-'}` +
    (D.advantage ? ` · group: ${D.advantage.group.map((g) => `${g.episode.split('/').pop()} r=${fmt(g.reward)} A=${fmt(g.advantage)}`).join(', ')} ${D.advantage.note}` : '');
  const rt = $('#rows tbody'), more = $('#rows-more'); let n = 0;
  const addRows = () => { for (const r of D.rows.slice(n, n + 200)) { const tr = el('tr', {'data-row': r.id});
      const calls = el('td'); r.calls.forEach((s, j) => { if (j) calls.append(', ');
        calls.append(callLink(s.call)); if (s.owned) calls.append(el('b', {}, ' (loss)')); });
      tr.append(el('td', {}, r.id), el('td', {}, String(r.tokens)), el('td', {}, String(r.loss_tokens)), calls);
      rt.append(tr); }
    n += 200; more.style.display = n < D.rows.length ? '' : 'none'; };
  more.addEventListener('click', addRows); addRows();
}

summary(); tree(); tip(); tables();
['q', 'state'].forEach((id) => $('#' + id).addEventListener('input', filter));
$('#call-scroll').addEventListener('scroll', () => requestAnimationFrame(paint));
filter();
if (D.calls.length) open(D.calls[0].id, false);
requestAnimationFrame(() => { window.groveViewReady = performance.now() - T0; });
