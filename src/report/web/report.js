// The report page: reads the JSON and the timeline blob embedded in the
// page (written by src/report/report.cc) and draws the step chart, the
// summary tables, the timeline (canvas, levels of detail) and the flame
// graphs. No libraries, nothing fetched.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const report = (window.spyglassReport = { ready: false });

  // ---- formatting -------------------------------------------------------------
  function fmtNs(ns) {
    const a = Math.abs(ns);
    if (a >= 1e9) return (ns / 1e9).toFixed(3) + ' s';
    if (a >= 1e6) return (ns / 1e6).toFixed(3) + ' ms';
    if (a >= 1e3) return (ns / 1e3).toFixed(3) + ' µs';
    return Math.round(ns) + ' ns';
  }
  function fmtBytes(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0, v = Math.abs(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? '-' : '') + (i ? v.toFixed(1) : v) + ' ' + u[i];
  }
  function hue(s) {
    let h = 2166136261;
    for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
    return (h >>> 0) % 360;
  }
  const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  const looksNs = (k) => /(_ns|ns)$/.test(k);
  const looksBytes = (k) => /bytes$/.test(k);
  function fmtCell(k, v) {
    if (typeof v === 'number') {
      if (looksNs(k)) return fmtNs(v);
      if (looksBytes(k)) return fmtBytes(v);
      if (/(share|fraction|pct|percent)/.test(k)) return (k.includes('pct') || k.includes('percent') ? v : v * 100).toFixed(1) + ' %';
      return Number.isInteger(v) ? String(v) : v.toFixed(3);
    }
    if (Array.isArray(v)) return v.map((x) => (isObj(x) ? JSON.stringify(x) : String(x))).join(', ');
    if (isObj(v)) return JSON.stringify(v);
    return v === null || v === undefined ? '' : String(v);
  }

  // ---- summary tables (whatever the analysis gives, as tables) ----------------
  const kMaxRows = 200;
  const kMaxThreadBlocks = 20;  // per-thread blocks of top annotations
  // A table of objects; `cols` picks and orders the columns (default: all keys).
  function table(rows, cls, cols) {
    const keys = cols ? cols.slice() : [];
    if (!cols) for (const r of rows.slice(0, kMaxRows)) for (const k in r) if (!keys.includes(k)) keys.push(k);
    const t = el('table', cls ? { class: cls } : {});
    const head = el('tr');
    for (const k of keys) head.appendChild(el('th', { class: rows.length && typeof rows[0][k] === 'number' ? 'num' : '' }, k.replace(/_ns$/, '').replace(/_/g, ' ')));
    t.appendChild(head);
    for (const r of rows.slice(0, kMaxRows)) {
      const tr = el('tr');
      for (const k of keys) tr.appendChild(el('td', { class: typeof r[k] === 'number' ? 'num' : '' }, fmtCell(k, r[k])));
      t.appendChild(tr);
    }
    return t;
  }
  function section(parent, title, rows, cols, note) {
    if (!Array.isArray(rows) || !rows.length) return;
    parent.appendChild(el('h3', {}, title));
    if (note) parent.appendChild(el('div', { class: 'more' }, note));
    parent.appendChild(table(rows, '', cols));
    if (rows.length > kMaxRows) parent.appendChild(el('div', { class: 'more' }, `${rows.length - kMaxRows} more rows`));
  }

  // The tables of `spyglass summary` (src/analysis/summary.h); keys this page
  // does not know are shown as generic tables after them.
  function renderSummary(box, s) {
    const known = new Set();
    const take = (k) => { known.add(k); return s[k]; };
    const kv = el('table', { class: 'kv' });
    for (const k of ['file', 'producer', 'hostnames', 'file_bytes', 'planes', 'lines', 'events', 'wall_ns']) {
      const v = take(k);
      if (v === undefined || v === '' || (Array.isArray(v) && !v.length)) continue;
      const tr = el('tr');
      tr.appendChild(el('th', {}, k === 'wall_ns' ? 'wall time' : k.replace('_', ' ')));
      tr.appendChild(el('td', { class: typeof v === 'number' ? 'num' : '' }, fmtCell(k, v)));
      kv.appendChild(tr);
    }
    box.appendChild(kv);
    for (const k of ['start_ns', 'end_ns']) take(k);
    const st = take('steps');
    if (st && st.duration && st.duration.count) {
      section(box, `Steps ("${st.name}")`, [st.duration], ['count', 'mean_ns', 'stddev_ns', 'min_ns', 'p50_ns', 'p90_ns', 'p99_ns', 'max_ns']);
      section(box, 'Slowest steps', (st.slowest || []).map((x) => ({ step: x.number, duration_ns: x.duration_ns, start_ns: x.start_ns })));
    }
    const ann = ['name', 'count', 'total_ns', 'self_ns', 'mean_ns', 'share', 'self_share'];
    section(box, 'Top annotations by total time (all threads)', take('top_total'), ann);
    section(box, 'Top annotations by self time (all threads)', take('top_self'), ann);
    const threads = take('threads');
    const leftOut = take('threads_left_out') || 0;
    section(box, 'Threads', threads, ['plane', 'name', 'id', 'events', 'busy_ns', 'busy_share'],
      leftOut ? `the busiest ${(threads || []).length}; ${leftOut} more threads are left out` : '');
    // A block per thread for the busiest few only: a page with 100k of them
    // took half a minute to load.
    const blocks = (threads || []).filter((t) => (t.top_total || []).length);
    if (blocks.length > kMaxThreadBlocks)
      box.appendChild(el('div', { class: 'more' }, `top annotations of the busiest ${kMaxThreadBlocks} threads; ` +
        `${blocks.length - kMaxThreadBlocks} more threads have none shown`));
    for (const t of blocks.slice(0, kMaxThreadBlocks)) {
      const d = el('details', { class: 'thread' });
      d.appendChild(el('summary', {}, `${t.plane} · ${t.name}: top annotations`));
      section(d, 'by total time', t.top_total, ann);
      section(d, 'by self time', t.top_self, ann);
      box.appendChild(d);
    }
    const ops = ['device', 'name', 'count', 'total_ns', 'mean_ns', 'share'];
    section(box, 'GPU kernels', take('kernels'), ops);
    section(box, 'GPU copies', take('copies'), ops);
    // Bytes shown as bytes (the keys alone do not say so).
    const counterRows = (take('counters') || []).map((c) => (c.unit === 'bytes' ? { ...c, peak: fmtBytes(c.peak), last: fmtBytes(c.last) } : c));
    section(box, 'Counter peaks', counterRows, ['plane', 'name', 'samples', 'peak', 'peak_at_ns', 'last']);
    section(box, 'Dropped', take('dropped'), ['plane', 'name', 'value']);
    for (const k of ['errors', 'warnings']) {
      const v = take(k);
      if (Array.isArray(v) && v.length) section(box, k, v.map((m) => ({ [k.slice(0, -1)]: m })));
    }
    const rest = {};
    for (const k in s) if (!known.has(k)) rest[k] = s[k];
    if (Object.keys(rest).length) renderValue(box, '', rest, 0);
  }

  function renderValue(parent, key, v, depth) {
    if (Array.isArray(v) && v.length && v.every(isObj)) {
      parent.appendChild(el(depth ? 'h3' : 'h3', {}, key));
      parent.appendChild(table(v));
      if (v.length > kMaxRows) parent.appendChild(el('div', { class: 'more' }, `${v.length - kMaxRows} more rows`));
    } else if (isObj(v)) {
      const scalars = Object.entries(v).filter(([, x]) => !isObj(x) && !(Array.isArray(x) && x.length && x.every(isObj)));
      const nested = Object.entries(v).filter(([, x]) => isObj(x) || (Array.isArray(x) && x.length && x.every(isObj)));
      if (key) parent.appendChild(el('h3', {}, key));
      if (scalars.length) {
        const t = el('table', { class: 'kv' });
        for (const [k, x] of scalars) {
          const tr = el('tr');
          tr.appendChild(el('th', {}, k));
          tr.appendChild(el('td', { class: typeof x === 'number' ? 'num' : '' }, fmtCell(k, x)));
          t.appendChild(tr);
        }
        parent.appendChild(t);
      }
      for (const [k, x] of nested) renderValue(parent, key && depth ? `${key} / ${k}` : k, x, depth + 1);
    } else if (Array.isArray(v) && v.length) {
      parent.appendChild(el('h3', {}, key));
      parent.appendChild(el('div', {}, fmtCell(key, v)));
    }
  }

  const stepOf = (o) => o.number, durOf = (o) => o.duration_ns;

  function renderSteps(steps) {
    const box = $('sg-steps');
    box.textContent = '';
    const n = steps.length;
    const durs = steps.map(durOf);
    const max = Math.max(...durs, 1);
    const W = Math.max(600, Math.min(1200, box.clientWidth || 900)), H = 220, L = 70, B = 24, T = 8;
    const svgNs = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(svgNs, 'svg');
    svg.setAttribute('width', W); svg.setAttribute('height', H); svg.setAttribute('id', 'sg-step-chart');
    const mk = (tag, a, text) => { const e = document.createElementNS(svgNs, tag); for (const k in a) e.setAttribute(k, a[k]); if (text !== undefined) e.textContent = text; return e; };
    // More steps than pixels: one bar per pixel column, the slowest step of it.
    const cols = Math.min(n, W - L - 8);
    const bw = (W - L - 8) / cols;
    for (let c = 0; c < cols; c++) {
      const lo = Math.floor((c * n) / cols), hi = Math.max(lo + 1, Math.floor(((c + 1) * n) / cols));
      let best = lo;
      for (let i = lo; i < hi; i++) if (durs[i] > durs[best]) best = i;
      const h = ((H - B - T) * durs[best]) / max;
      const r = mk('rect', { class: 'bar', x: L + c * bw + 0.5, y: H - B - h, width: Math.max(1, bw - 1), height: h,
                              'data-step': stepOf(steps[best]), 'data-ns': durs[best] });
      r.appendChild(mk('title', {}, `step ${stepOf(steps[best])}: ${fmtNs(durs[best])}`));
      svg.appendChild(r);
    }
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4, y = H - B - ((H - B - T) * i) / 4;
      svg.appendChild(mk('line', { x1: L - 4, x2: W, y1: y, y2: y, stroke: '#e3e3e3' }));
      svg.appendChild(mk('text', { class: 'axis', x: L - 6, y: y + 3, 'text-anchor': 'end' }, fmtNs(v)));
    }
    svg.appendChild(mk('text', { class: 'axis', x: L, y: H - 8 }, `step ${stepOf(steps[0])}`));
    svg.appendChild(mk('text', { class: 'axis', x: W - 4, y: H - 8, 'text-anchor': 'end' }, `step ${stepOf(steps[n - 1])}`));
    box.appendChild(el('div', { id: 'sg-step-count' }, `${n} steps`));
    box.appendChild(svg);
    const d = el('details');
    d.appendChild(el('summary', {}, 'every step'));
    d.appendChild(table(steps.map((s) => ({ step: stepOf(s), duration_ns: durOf(s) })), 'steps-table'));
    if (n > kMaxRows) d.appendChild(el('div', { class: 'more' }, `${n - kMaxRows} more steps (the chart has them all)`));
    box.appendChild(d);
  }

  // ---- the timeline -------------------------------------------------------------
  const LANE = 16, GAP = 6, HEAD = 16, AXIS = 22, GUTTER = 170, COUNTER = 40;

  function Timeline(tl, blob) {
    const canvas = $('tl-canvas'), scroll = $('tl-scroll'), spacer = $('tl-spacer'), tip = $('tl-tip');
    const ctx = canvas.getContext('2d');
    const tracks = tl.tracks, counters = tl.counters || [];
    const cache = new Map();
    const total = Math.max(tl.duration_ns, 1);
    let t0 = 0, t1 = total;
    // Rows: each plane's counters above its threads or streams (memory and
    // time on one timeline), then each track a heading and its lanes.
    const rows = [];
    let y = AXIS;
    const placed = new Set();
    const counterRows = (plane) => counters.forEach((c, ci) => {
      if ((plane !== null && c.plane !== plane) || placed.has(ci)) return;
      placed.add(ci);
      rows.push({ kind: 'head', y, counter: c });
      y += HEAD;
      rows.push({ kind: 'counter', y, ci, levels: c.levels });
      y += COUNTER + GAP;
    });
    tracks.forEach((t, ti) => {
      if (ti === 0 || tracks[ti - 1].plane !== t.plane) counterRows(t.plane);
      rows.push({ kind: 'head', y, track: t });
      y += HEAD;
      t.lanes.forEach((levels, li) => { rows.push({ kind: 'lane', y, ti, li, levels }); y += LANE; });
      y += GAP;
    });
    counterRows(null);  // those of planes with no thread
    const height = y;
    spacer.style.height = height + 'px';
    scroll.style.height = Math.min(height + 2, Math.round(window.innerHeight * 0.7)) + 'px';

    // A level's bytes in the blob (varints, zigzag varints, float64s).
    let view = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
    function reader(off, len) {
      let p = off;
      const stop = off + len;
      const cut = () => { throw new Error('timeline data is cut short'); };
      const varint = () => {
        let v = 0, mul = 1, b;
        do { if (p >= stop) cut(); b = blob[p++]; v += (b & 127) * mul; mul *= 128; } while (b & 128);
        return v;
      };
      const zigzag = () => { const z = varint(); return z % 2 ? -(z + 1) / 2 : z / 2; };
      const f64 = () => { if (p + 8 > stop) cut(); const v = view.getFloat64(p, true); p += 8; return v; };
      return { varint, zigzag, f64 };
    }
    function decode(ti, li, k) {
      const key = ti + ':' + li + ':' + k;
      let d = cache.get(key);
      if (d) return d;
      const [th, n, off, len] = tracks[ti].lanes[li][k];
      const start = new Float64Array(n), end = new Float64Array(n), name = new Uint32Array(n), detail = new Uint32Array(n),
        count = new Uint32Array(n);
      const { varint, zigzag } = reader(off, len);
      let prev = tracks[ti].at_ns;
      for (let i = 0; i < n; i++) {
        start[i] = prev + zigzag();
        end[i] = start[i] + varint();
        name[i] = varint();
        detail[i] = varint();
        count[i] = th > 0 ? varint() : 1;
        prev = end[i];
      }
      d = { start, end, name, detail, count, threshold: th };
      cache.set(key, d);
      return d;
    }
    // A counter level: point times, and values (lowest, highest, last).
    function decodeCounter(ci, k) {
      const key = 'c' + ci + ':' + k;
      let d = cache.get(key);
      if (d) return d;
      const [th, n, off, len] = counters[ci].levels[k];
      const t = new Float64Array(n), lo = new Float64Array(n), hi = new Float64Array(n), last = new Float64Array(n);
      const { zigzag, f64 } = reader(off, len);
      let prev = counters[ci].at_ns;
      for (let i = 0; i < n; i++) {
        t[i] = prev + zigzag();
        prev = t[i];
        if (th > 0) { lo[i] = f64(); hi[i] = f64(); last[i] = f64(); } else { lo[i] = hi[i] = last[i] = f64(); }
      }
      d = { t, lo, hi, last, threshold: th };
      cache.set(key, d);
      return d;
    }
    const fmtValue = (c, v) => (c.bytes ? fmtBytes(v) : Number.isInteger(v) ? String(v) : v.toPrecision(4));
    // The index of the last point at or before t (-1: none).
    function lastAtOrBefore(ts, t) {
      let lo = 0, hi = ts.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (ts[m] <= t) lo = m + 1; else hi = m; }
      return lo - 1;
    }
    // A step line over a filled area, scaled from 0 (or the lowest value)
    // to the highest; at coarser levels each point also draws its range.
    function drawCounter(r, ry, nsPerPx) {
      const c = counters[r.ci];
      const k = levelFor(r.levels, nsPerPx);
      const d = decodeCounter(r.ci, k);
      const base = Math.min(0, c.min), span = c.max - base || 1;
      const yOf = (v) => ry + COUNTER - 1 - ((v - base) / span) * (COUNTER - 3);
      const xOf = (t) => Math.min(width, Math.max(GUTTER, GUTTER + (t - t0) / nsPerPx));
      let i = Math.max(0, lastAtOrBefore(d.t, t0));
      const color = hue(c.name);
      const xs = [], ys = [];
      let v = d.last[i];
      xs.push(xOf(d.t[i])); ys.push(yOf(v));
      let points = 1;
      ctx.fillStyle = `hsl(${color},60%,40%)`;
      for (i++; i < d.t.length && d.t[i] <= t1; i++, points++) {
        const x = xOf(d.t[i]);
        xs.push(x); ys.push(yOf(v));
        v = d.last[i];
        xs.push(x); ys.push(yOf(v));
        if (d.threshold > 0 && d.hi[i] > d.lo[i]) ctx.fillRect(x, yOf(d.hi[i]), 1, Math.max(1, yOf(d.lo[i]) - yOf(d.hi[i])));
      }
      // Held until the next point (out of view) or the counter's end.
      const end = i < d.t.length ? d.t[i] : d.t[d.t.length - 1];
      xs.push(xOf(end)); ys.push(yOf(v));
      ctx.beginPath();
      ctx.moveTo(xs[0], yOf(base));
      for (let j = 0; j < xs.length; j++) ctx.lineTo(xs[j], ys[j]);
      ctx.lineTo(xs[xs.length - 1], yOf(base));
      ctx.closePath();
      ctx.fillStyle = `hsla(${color},60%,60%,0.35)`;
      ctx.fill();
      ctx.beginPath();
      ctx.moveTo(xs[0], ys[0]);
      for (let j = 1; j < xs.length; j++) ctx.lineTo(xs[j], ys[j]);
      ctx.strokeStyle = `hsl(${color},60%,35%)`;
      ctx.stroke();
      return { points, level: k };
    }
    // The coarsest level that merges only what is under a pixel.
    function levelFor(levels, nsPerPx) {
      let k = 0;
      for (let i = 1; i < levels.length; i++) if (levels[i][0] <= nsPerPx) k = i;
      return k;
    }
    function firstEndingAfter(ends, t) {
      let lo = 0, hi = ends.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (ends[m] < t) lo = m + 1; else hi = m; }
      return lo;
    }

    const stats = { drawn: 0, maxLevel: 0, lanesDrawn: 0, draws: 0, countersDrawn: 0, counterPoints: 0 };
    let width = 0, viewH = 0, pending = false;
    function resize() {
      const dpr = window.devicePixelRatio || 1;
      width = Math.max(300, scroll.clientWidth);
      viewH = Math.min(height, scroll.clientHeight || height);
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(viewH * dpr);
      canvas.style.width = width + 'px';
      canvas.style.height = viewH + 'px';
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      draw();
    }
    function draw() {
      pending = false;
      const top = scroll.scrollTop;
      const plot = width - GUTTER;
      const nsPerPx = (t1 - t0) / plot;
      ctx.clearRect(0, 0, width, viewH);
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'middle';
      let drawn = 0, maxLevel = 0, lanesDrawn = 0, countersDrawn = 0, counterPoints = 0;
      for (const r of rows) {
        const ry = r.y - top;
        if (ry + (r.kind === 'counter' ? COUNTER : LANE) < AXIS || ry > viewH) continue;
        if (r.kind === 'head' && r.counter) {
          const c = r.counter;
          ctx.fillStyle = '#eef3ee';
          ctx.fillRect(0, ry, width, HEAD);
          ctx.fillStyle = '#222';
          ctx.fillText(`${c.plane}  ·  ${c.name}  (counter: ${c.samples} samples, ` +
            `${c.min < 0 ? `lowest ${fmtValue(c, c.min)}, ` : ''}highest ${fmtValue(c, c.max)})`, 4, ry + HEAD / 2);
          continue;
        }
        if (r.kind === 'counter') {
          const got = drawCounter(r, ry, nsPerPx);
          countersDrawn++;
          counterPoints += got.points;
          continue;
        }
        if (r.kind === 'head') {
          ctx.fillStyle = '#f0f0f3';
          ctx.fillRect(0, ry, width, HEAD);
          ctx.fillStyle = '#222';
          const t = r.track;
          // Thread ids tell apart threads of one name (ids past 2^53 are approximate here).
          const id = t.id && !t.name.includes(String(t.id)) ? ` [${t.id}]` : '';
          ctx.fillText(`${t.plane}  ·  ${t.name}${id}  (${t.events} events${t.hidden ? `, ${t.hidden} nested too deep, not drawn` : ''})`, 4, ry + HEAD / 2);
          continue;
        }
        const k = levelFor(r.levels, nsPerPx);
        maxLevel = Math.max(maxLevel, k);
        const d = decode(r.ti, r.li, k);
        lanesDrawn++;
        let i = firstEndingAfter(d.end, t0);
        let lastPx = -1;
        for (; i < d.start.length && d.start[i] <= t1; i++) {
          const x = GUTTER + (d.start[i] - t0) / nsPerPx;
          const x2 = GUTTER + (d.end[i] - t0) / nsPerPx;
          const xa = Math.max(GUTTER, x), xb = Math.min(width, Math.max(x2, x + 1));
          if (xb <= lastPx && xb - xa < 1) continue;  // a pixel already covered
          const nm = tl.names[d.name[i]] || '';
          ctx.fillStyle = `hsl(${hue(nm)},55%,${d.count[i] > 1 ? 72 : 62}%)`;
          ctx.fillRect(xa, ry + 1, Math.max(1, xb - xa), LANE - 2);
          lastPx = xb;
          drawn++;
          if (xb - xa > 36) {
            ctx.save();
            ctx.beginPath();
            ctx.rect(xa, ry, xb - xa - 2, LANE);
            ctx.clip();
            ctx.fillStyle = '#111';
            ctx.fillText(d.count[i] > 1 ? `${nm} +${d.count[i] - 1}` : nm, xa + 3, ry + LANE / 2);
            ctx.restore();
          }
        }
      }
      // Axis and gutter over the spans.
      ctx.fillStyle = '#fff';
      ctx.fillRect(0, 0, width, AXIS);
      ctx.fillStyle = '#333';
      ctx.strokeStyle = '#ccc';
      const step = niceStep((t1 - t0) / 8);
      for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
        const x = GUTTER + (t - t0) / nsPerPx;
        ctx.beginPath(); ctx.moveTo(x, AXIS - 6); ctx.lineTo(x, AXIS); ctx.stroke();
        ctx.fillText(fmtNs(t), x + 2, AXIS / 2 - 2);
      }
      ctx.beginPath(); ctx.moveTo(0, AXIS - 0.5); ctx.lineTo(width, AXIS - 0.5); ctx.stroke();
      stats.drawn = drawn; stats.maxLevel = maxLevel; stats.lanesDrawn = lanesDrawn; stats.draws++;
      stats.countersDrawn = countersDrawn; stats.counterPoints = counterPoints;
      if (report.onView) report.onView(t0, t1, plot);  // spyglass view (view.js) loads what is shown
      canvas.dataset.drawn = drawn;
      canvas.dataset.level = maxLevel;
      $('tl-info').textContent = `${fmtNs(t0)} – ${fmtNs(t1)} of ${fmtNs(total)} · ${tl.events} events, ${drawn} spans drawn` +
        (counters.length ? ` · ${counters.length} counter${counters.length > 1 ? 's' : ''}` : '');
    }
    function niceStep(x) {
      const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1))));
      for (const m of [1, 2, 5, 10]) if (p * m >= x) return p * m;
      return p * 10;
    }
    function redraw() { if (!pending) { pending = true; requestAnimationFrame(draw); } }
    function setView(a, b) {
      const minSpan = 10;  // ns
      if (b - a < minSpan) { const c = (a + b) / 2; a = c - minSpan / 2; b = c + minSpan / 2; }
      const span = Math.min(b - a, total);
      a = Math.max(0, Math.min(a, total - span));
      t0 = a; t1 = a + span;
      redraw();
    }
    function zoom(factor, atPx) {
      const plot = width - GUTTER;
      const f = Math.min(Math.max((atPx - GUTTER) / plot, 0), 1);
      const at = t0 + f * (t1 - t0);
      const span = (t1 - t0) * factor;
      setView(at - f * span, at - f * span + span);
    }
    function pan(px) { const d = (px * (t1 - t0)) / (width - GUTTER); setView(t0 + d, t1 + d); }

    canvas.addEventListener('wheel', (e) => {
      if (e.shiftKey) return;  // the scroll box scrolls the threads
      e.preventDefault();
      const r = canvas.getBoundingClientRect();
      zoom(Math.pow(1.0015, e.deltaY), e.clientX - r.left);
    }, { passive: false });
    let drag = null;
    canvas.addEventListener('mousedown', (e) => { drag = e.clientX; canvas.style.cursor = 'grabbing'; });
    window.addEventListener('mouseup', () => { drag = null; canvas.style.cursor = 'grab'; });
    window.addEventListener('mousemove', (e) => {
      if (drag !== null) { pan(drag - e.clientX); drag = e.clientX; tip.hidden = true; return; }
      if (e.target !== canvas) { tip.hidden = true; return; }
      const r = canvas.getBoundingClientRect();
      const hit = spanAt(e.clientX - r.left, e.clientY - r.top);
      if (!hit) { tip.hidden = true; return; }
      tip.textContent = hit;
      tip.style.left = e.clientX + 12 + 'px';
      tip.style.top = e.clientY + 12 + 'px';
      tip.hidden = false;
    });
    function spanAt(px, py) {
      if (px < GUTTER) return null;
      const yy = py + scroll.scrollTop;
      const nsPerPx = (t1 - t0) / (width - GUTTER);
      const crow = rows.find((r) => r.kind === 'counter' && yy >= r.y && yy < r.y + COUNTER);
      if (crow) {
        const c = counters[crow.ci], d = decodeCounter(crow.ci, levelFor(crow.levels, nsPerPx));
        const t = t0 + (px - GUTTER) * nsPerPx;
        const i = lastAtOrBefore(d.t, t);
        if (i < 0) return null;
        const range = d.threshold > 0 && d.hi[i] > d.lo[i] ? `\n(${fmtValue(c, d.lo[i])} – ${fmtValue(c, d.hi[i])} within ${fmtNs(d.threshold)})` : '';
        return `${c.name}: ${fmtValue(c, d.last[i])}${range}\nat ${fmtNs(d.t[i])}`;
      }
      const row = rows.find((r) => r.kind === 'lane' && yy >= r.y && yy < r.y + LANE);
      if (!row) return null;
      const d = decode(row.ti, row.li, levelFor(row.levels, nsPerPx));
      const t = t0 + (px - GUTTER) * nsPerPx;
      const i = firstEndingAfter(d.end, t - nsPerPx);
      if (i >= d.start.length || d.start[i] > t + nsPerPx) return null;
      const nm = tl.names[d.name[i]] || '';
      const what = d.count[i] > 1 ? `${d.count[i]} events (longest: ${nm}) over` : nm + '\n';
      const more = d.detail[i] ? '\n' + (tl.details[d.detail[i] - 1] || '') : '';
      return `${what} ${fmtNs(d.end[i] - d.start[i])}\nat ${fmtNs(d.start[i])}${more}`;
    }
    scroll.addEventListener('scroll', redraw);
    window.addEventListener('resize', resize);
    $('tl-in').onclick = () => zoom(0.5, GUTTER + (width - GUTTER) / 2);
    $('tl-out').onclick = () => zoom(2, GUTTER + (width - GUTTER) / 2);
    $('tl-reset').onclick = () => setView(0, total);
    canvas.tabIndex = 0;
    canvas.addEventListener('keydown', (e) => {
      const c = GUTTER + (width - GUTTER) / 2;
      if (e.key === 'w') zoom(0.8, c);
      else if (e.key === 's') zoom(1.25, c);
      else if (e.key === 'a') pan(-(width - GUTTER) / 10);
      else if (e.key === 'd') pan((width - GUTTER) / 10);
      else if (e.key === '0') setView(0, total);
      else return;
      e.preventDefault();
    });
    resize();
    // For tests and the console: the view in ns from the first event.
    return {
      // spyglass view: new levels for every lane and counter (one each, a window of the run) and their bytes.
      setData: (lanes, counterLevels, bytes) => {
        blob = bytes; view = new DataView(blob.buffer, blob.byteOffset, blob.byteLength); cache.clear();
        lanes.forEach((ls, ti) => { tracks[ti].lanes = ls; });
        counterLevels.forEach((ls, ci) => { counters[ci].levels = ls; });
        for (const r of rows) r.levels = r.kind === 'lane' ? tracks[r.ti].lanes[r.li] : r.kind === 'counter' ? counters[r.ci].levels : r.levels;
        draw();
      },
      stats, setView: (a, b) => { setView(a, b); draw(); return { ...stats }; }, view: () => [t0, t1], gutter: GUTTER,
      // Where a counter's plot is on the canvas now: [top, height] in CSS px.
      counterBand: (name) => {
        const r = rows.find((x) => x.kind === 'counter' && counters[x.ci].name === name);
        return r ? [r.y - scroll.scrollTop, COUNTER] : null;
      },
      laneBand: (name, lane) => {
        const r = rows.find((x) => x.kind === 'lane' && tracks[x.ti].name === name && x.li === lane);
        return r ? [r.y - scroll.scrollTop, LANE] : null;
      },
    };
  }

  // ---- flame graphs ---------------------------------------------------------------
  function renderFlame(box, g) {
    const n = g.name.length;
    const fmt = g.unit === 'bytes' ? fmtBytes : (v) => String(v);
    const sec = el('div', { class: 'profile', 'data-title': g.title });
    sec.appendChild(el('h3', {}, `${g.title} — ${fmt(g.total)} ${g.unit === 'bytes' ? 'live' : 'samples'}`));
    if (g.negative_samples) sec.appendChild(el('div', { class: 'more' }, `${g.negative_samples} samples with negative values counted as 0`));
    if (g.folded_frames) sec.appendChild(el('div', { class: 'more' }, `${g.folded_frames} interpreter and import frames folded away (spyglass report --all-frames keeps them)`));
    if (g.sites.length) {
      sec.appendChild(el('div', {}, 'Top allocation sites (first frame past the allocator):'));
      sec.appendChild(table(g.sites.map((s) => ({ site: s.site, [g.unit === 'bytes' ? 'bytes' : 'value']: s.value, count: s.count,
        share: g.total ? s.value / g.total : 0 })), 'sites'));
    }
    // Subtree ends and x offsets (in value units) from the preorder.
    const endOf = new Int32Array(n), x = new Float64Array(n), parent = new Int32Array(n).fill(-1);
    const stack = [];
    const cursor = new Float64Array(n);
    let maxDepth = 0;
    for (let i = 0; i < n; i++) {
      while (stack.length && g.depth[stack[stack.length - 1]] >= g.depth[i]) endOf[stack.pop()] = i;
      if (stack.length) { const p = stack[stack.length - 1]; parent[i] = p; x[i] = x[p] + cursor[p]; cursor[p] += g.value[i]; }
      stack.push(i);
      maxDepth = Math.max(maxDepth, g.depth[i]);
    }
    while (stack.length) endOf[stack.pop()] = n;
    const crumbs = el('div', { class: 'fl-crumbs' }, 'click a frame to zoom in, the top bar to zoom out');
    const flame = el('div', { class: 'flame' });
    flame.style.height = (maxDepth + 1) * 18 + 'px';
    sec.appendChild(crumbs);
    sec.appendChild(flame);
    box.appendChild(sec);
    function show(root) {
      flame.textContent = '';
      const W = flame.clientWidth || 1000;
      const scale = g.value[root] > 0 ? W / g.value[root] : 0;
      const add = (i, left, w, above) => {
        const nm = g.names[g.name[i]];
        const d = el('div', { class: 'fl-node' + (above ? ' fl-above' : ''), 'data-name': nm, 'data-value': g.value[i],
          title: `${nm}\n${fmt(g.value[i])} (${g.total ? ((100 * g.value[i]) / g.total).toFixed(1) : 0} % of all)` });
        d.style.left = left + 'px'; d.style.width = w + 'px'; d.style.top = g.depth[i] * 18 + 'px';
        d.style.background = i === 0 ? '#ddd' : `hsl(${20 + (hue(nm) % 40)},80%,${60 + (hue(nm) % 15)}%)`;
        if (w > 30) d.textContent = nm;
        d.onclick = () => show(above && i === root ? (parent[i] >= 0 ? parent[i] : 0) : i);
        flame.appendChild(d);
      };
      for (let a = parent[root]; a >= 0; a = parent[a]) add(a, 0, W, true);
      for (let i = root; i < endOf[root]; ) {
        const w = g.value[i] * scale;
        if (w < 1.5) { i = endOf[i]; continue; }  // its children are narrower still
        add(i, (x[i] - x[root]) * scale, w, false);
        i++;
      }
      crumbs.textContent = root === 0 ? 'click a frame to zoom in' : `zoomed to ${g.names[g.name[root]]} — click a faded frame above to zoom out`;
    }
    show(0);
  }

  // ---- the page -------------------------------------------------------------------
  async function inflate(b64) {
    const bin = atob(b64.trim());
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  async function main() {
    const data = JSON.parse($('sg-data').textContent);
    report.data = data;
    $('sg-title').textContent = `${data.title} · ${data.generator}`;
    for (const n of data.notes || []) $('sg-notes').appendChild(el('li', {}, n));
    const steps = data.summary && data.summary.steps && data.summary.steps.all;
    if (Array.isArray(steps) && steps.length) renderSteps(steps);
    if (data.summary) {
      const box = $('sg-summary');
      box.textContent = '';
      if (isObj(data.summary)) renderSummary(box, data.summary);
    }
    if (data.flames.length) {
      const box = $('sg-memory');
      box.textContent = '';
      for (const g of data.flames) renderFlame(box, g);
    }
    const blob = await inflate($('sg-blob').textContent);
    if (blob.length !== data.timeline.blob_bytes) throw new Error('timeline data is damaged');
    if (data.timeline.hidden_tracks) {
      $('sg-notes').appendChild(el('li', {}, `timeline: ${data.timeline.hidden_tracks} more threads with ` +
        `${data.timeline.hidden_track_events} events in all are not shown (only the ${data.timeline.tracks.length} busiest)`));
    }
    if (data.timeline.hidden_details) {
      $('sg-notes').appendChild(el('li', {}, `timeline: ${data.timeline.hidden_details} events show no details in their ` +
        `tooltip (only the first ${data.timeline.details.length} distinct ones are kept)`));
    }
    if (data.timeline.hidden_counters || data.timeline.hidden_counter_samples) {
      const hc = data.timeline.hidden_counters;
      $('sg-notes').appendChild(el('li', {}, `timeline: ${data.timeline.hidden_counter_samples} counter samples are not shown ` +
        (hc ? `(${hc} counters past the first ${data.timeline.counters.length}, and any value that is not a finite number)` : '(values that are not finite numbers)')));
    }
    if (data.timeline.tracks.length || (data.timeline.counters || []).length) report.timeline = Timeline(data.timeline, blob);
    else $('tl-info').textContent = 'No events in this run.';
    // Everything drawn once: how long the page took to show (bench/report_bench.sh).
    report.readyMs = performance.now();
    report.ready = true;
    document.body.dataset.ready = '1';
  }
  main().catch((e) => {
    report.error = String(e && e.message || e);
    document.body.dataset.error = report.error;
    const n = el('div', { class: 'error' }, 'The report could not be shown: ' + report.error);
    n.style.color = '#b00020';
    document.body.prepend(n);
  });
})();
