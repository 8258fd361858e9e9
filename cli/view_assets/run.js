const D = JSON.parse(document.getElementById('run-data').textContent);
const $ = (s) => document.querySelector(s);
const el = (tag, attrs = {}, text) => { const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text; return e; };
const fmt = (x) => (x === null || x === undefined) ? '-' : (+x).toFixed(3);
const NS = 'http://www.w3.org/2000/svg', COLORS = ['#1d6fd8', '#d8701d', '#2a9d4b', '#b02ad8', '#d82a4b', '#555'];
function svg(tag, attrs) { const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; }
function chart() {
  const series = {'mean reward': D.steps.map((s) => [s.step, s.mean_reward])};
  for (const s of D.steps) for (const [k, v] of Object.entries(s.reward_components || {}))
    (series[k] = series[k] || []).push([s.step, v]);
  const W = 720, H = 260, P = 36, all = Object.values(series).flat();
  const box = $('#chart'); if (!all.length) { box.textContent = 'no steps recorded yet'; return; }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(0, ...ys), y1 = Math.max(1, ...ys);
  const X = (x) => P + (x - x0) / Math.max(1, x1 - x0) * (W - 2 * P), Y = (y) => H - P - (y - y0) / (y1 - y0) * (H - 2 * P);
  const g = svg('svg', {width: W, height: H, id: 'reward-chart'});
  g.append(svg('line', {x1: P, y1: H - P, x2: W - P, y2: H - P, stroke: '#999'}), svg('line', {x1: P, y1: P, x2: P, y2: H - P, stroke: '#999'}));
  for (const y of [y0, (y0 + y1) / 2, y1]) { const t = svg('text', {x: 2, y: Y(y) + 4, 'font-size': 10}); t.textContent = y.toFixed(2); g.append(t); }
  Object.entries(series).forEach(([name, pts], i) => {
    const c = COLORS[i % COLORS.length];
    g.append(svg('polyline', {points: pts.map(([x, y]) => `${X(x)},${Y(y)}`).join(' '), fill: 'none', stroke: c, 'stroke-width': 2, 'data-series': name}));
    const t = svg('text', {x: W - P - 150, y: P + 14 * i, fill: c, 'font-size': 11}); t.textContent = name; g.append(t); });
  box.append(g);
}
function table() {
  const tb = $('#steps tbody');
  for (const s of D.steps) {
    const tr = el('tr', {'data-step': s.step});
    tr.append(el('td', {}, String(s.step)), el('td', {}, fmt(s.mean_reward)), el('td', {}, String(s.episodes)),
      el('td', {}, String(s.failed_episodes)), el('td', {}, String(s.policy_version)),
      el('td', {}, Object.entries(s.reward_components || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(', ')));
    const eps = el('td');
    for (const e of s.episode_list) { const name = e.episode_id.split('/').slice(-2).join('/');
      const a = e.written ? el('a', {href: `episodes/${e.page}`, class: 'episode-link', 'data-episode': e.episode_id}, name)
        : el('span', {title: `grove episode view ${e.episode_id}`}, name);
      eps.append(a, el('span', {}, ` r=${fmt(e.reward)}${e.failed ? ' failed' : ''}  `)); }
    tr.append(eps); tb.append(tr);
  }
}
chart(); table();
