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
  // At most 3 decimals, no trailing zeros: 500 ms, 1.25 s.
  const trim = (v, digits) => String(Number(v.toFixed(digits)));
  function fmtNs(ns) {
    const a = Math.abs(ns);
    if (a >= 1e9) return trim(ns / 1e9, 3) + ' s';
    if (a >= 1e6) return trim(ns / 1e6, 3) + ' ms';
    if (a >= 1e3) return trim(ns / 1e3, 3) + ' µs';
    return Math.round(ns) + ' ns';
  }
  // An axis label: the unit of the tick step, and the digits the step needs.
  function fmtTick(ns, step) {
    const unit = step >= 1e9 ? [1e9, 's'] : step >= 1e6 ? [1e6, 'ms'] : step >= 1e3 ? [1e3, 'µs'] : [1, 'ns'];
    const digits = Math.max(0, Math.min(3, -Math.floor(Math.log10(step / unit[0]) + 1e-9)));
    return trim(ns / unit[0], digits) + ' ' + unit[1];
  }
  function fmtBytes(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0, v = Math.abs(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? '-' : '') + (i ? trim(v, 1) : v) + ' ' + u[i];
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
  function table(rows, cls, cols, onRow) {
    const keys = cols ? cols.slice() : [];
    if (!cols) for (const r of rows.slice(0, kMaxRows)) for (const k in r) if (!keys.includes(k)) keys.push(k);
    const t = el('table', cls ? { class: cls } : {});
    const head = el('tr');
    for (const k of keys) head.appendChild(el('th', { class: rows.length && typeof rows[0][k] === 'number' ? 'num' : '' }, k.replace(/_ns$/, '').replace(/_/g, ' ')));
    t.appendChild(head);
    for (const r of rows.slice(0, kMaxRows)) {
      const tr = el('tr');
      for (const k of keys) tr.appendChild(el('td', { class: typeof r[k] === 'number' ? 'num' : '' }, fmtCell(k, r[k])));
      if (onRow) { tr.className = 'jump'; tr.title = 'show it on the timeline'; tr.onclick = () => onRow(r); }
      t.appendChild(tr);
    }
    return t;
  }
  function section(parent, title, rows, cols, note, onRow) {
    if (!Array.isArray(rows) || !rows.length) return;
    parent.appendChild(el('h3', {}, title));
    if (note) parent.appendChild(el('div', { class: 'more' }, note));
    parent.appendChild(table(rows, '', cols, onRow));
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
      section(box, 'Slowest steps', (st.slowest || []).map((x) => ({ step: x.number, duration_ns: x.duration_ns, start_ns: x.start_ns })),
        undefined, '', (r) => jumpTo(r.start_ns, r.duration_ns));
    }
    const ann = ['name', 'count', 'total_ns', 'self_ns', 'mean_ns', 'share', 'self_share'];
    const findName = (r) => { if (!report.timeline) return; report.timeline.search(r.name); report.timeline.next(); showTimeline(); };
    section(box, 'Top annotations by total time (all threads)', take('top_total'), ann, '', findName);
    section(box, 'Top annotations by self time (all threads)', take('top_self'), ann, '', findName);
    const threads = take('threads');
    const leftOut = take('threads_left_out') || 0;
    section(box, 'Threads', threads, ['plane', 'name', 'id', 'events', 'busy_ns', 'busy_share'],
      leftOut ? `the busiest ${(threads || []).length}; ${leftOut} more threads are left out` : '',
      (r) => { if (report.timeline) { report.timeline.reveal(r.name); showTimeline(); } });
    // A block per thread for the busiest few only: a page with 100k of them
    // took half a minute to load.
    const blocks = (threads || []).filter((t) => (t.top_total || []).length);
    if (blocks.length > kMaxThreadBlocks)
      box.appendChild(el('div', { class: 'more' }, `top annotations of the busiest ${kMaxThreadBlocks} threads; ` +
        `${blocks.length - kMaxThreadBlocks} more threads have none shown`));
    for (const t of blocks.slice(0, kMaxThreadBlocks)) {
      const d = el('details', { class: 'thread' });
      d.appendChild(el('summary', {}, `${t.plane} · ${t.name}: top annotations`));
      section(d, 'by total time', t.top_total, ann, '', findName);
      section(d, 'by self time', t.top_self, ann, '', findName);
      box.appendChild(d);
    }
    const ops = ['device', 'name', 'count', 'total_ns', 'mean_ns', 'share'];
    section(box, 'GPU kernels', take('kernels'), ops, '', findName);
    section(box, 'GPU copies', take('copies'), ops, '', findName);
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
  const showTimeline = () => $('timeline').scrollIntoView({ block: 'start' });
  // A step (summary times: absolute ns) on the timeline, with a margin.
  function jumpTo(startNs, durNs) {
    const t = report.timeline;
    if (!t) return null;
    const a = startNs - report.data.timeline.start_ns, m = durNs * 0.05;
    showTimeline();
    return t.setView(a - m, a + durNs + m);
  }

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
      const s = steps[best];
      r.addEventListener('click', () => jumpTo(s.start_ns, s.duration_ns));
      svg.appendChild(r);
    }
    // Round ticks (0, 20 ms, 40 ms...), labelled with the digits they need.
    const p10 = Math.pow(10, Math.floor(Math.log10(Math.max(max / 4, 1))));
    const tick = [1, 2, 5, 10].map((m) => m * p10).find((x) => x >= max / 4);
    for (let v = 0; v <= max + 1e-9; v += tick) {
      const y = H - B - ((H - B - T) * v) / max;
      svg.appendChild(mk('line', { x1: L - 4, x2: W, y1: y, y2: y, stroke: '#e3e3e3' }));
      svg.appendChild(mk('text', { class: 'axis sg-step-tick', x: L - 6, y: y + 3, 'text-anchor': 'end' }, fmtTick(v, tick)));
    }
    svg.appendChild(mk('text', { class: 'axis', x: L, y: H - 8 }, `step ${stepOf(steps[0])}`));
    svg.appendChild(mk('text', { class: 'axis', x: W - 4, y: H - 8, 'text-anchor': 'end' }, `step ${stepOf(steps[n - 1])}`));
    box.appendChild(el('div', { id: 'sg-step-count' }, `${n} steps`));
    box.appendChild(svg);
    const d = el('details');
    d.appendChild(el('summary', {}, 'every step'));
    d.appendChild(table(steps.map((s) => ({ step: stepOf(s), duration_ns: durOf(s), start_ns: s.start_ns })), 'steps-table',
      ['step', 'duration_ns'], (r) => jumpTo(r.start_ns, r.duration_ns)));
    if (n > kMaxRows) d.appendChild(el('div', { class: 'more' }, `${n - kMaxRows} more steps (the chart has them all)`));
    box.appendChild(d);
  }

  // ---- the timeline -------------------------------------------------------------
  const LANE = 16, GAP = 6, HEAD = 16, AXIS = 22, GUTTER = 170, COUNTER = 40;
  const ICON = 14;  // head icons: collapse, pin, hide (x 2, 16, 30)
  const kMaxMatches = 1000000, kMaxFlowsDrawn = 3000;

  // Counters that share a unit share a scale: 216 B is not drawn as tall
  // as 2 MiB. Units: bytes, percent (by name), else the counter's own.
  function counterUnit(c) {
    if (c.bytes) return 'bytes';
    if (/(\.pct|_pct|percent|%)$/i.test(c.name)) return 'percent';
    return null;
  }

  function Timeline(tl, blob) {
    const canvas = $('tl-canvas'), scroll = $('tl-scroll'), spacer = $('tl-spacer'), tip = $('tl-tip');
    const ctx = canvas.getContext('2d');
    const tracks = tl.tracks, counters = tl.counters || [];
    const names = tl.names, nameEvents = tl.name_events || [];
    const cache = new Map();
    const total = Math.max(tl.duration_ns, 1);
    let t0 = 0, t1 = total;
    const state = tracks.map(() => ({ collapsed: false, hidden: false, pinned: false }));
    const planeCollapsed = new Set();
    const planes = [];
    for (const t of tracks) if (!planes.includes(t.plane)) planes.push(t.plane);
    for (const c of counters) if (!planes.includes(c.plane)) planes.push(c.plane);
    // Shared scales: per unit, the lowest and highest of its counters.
    const scales = new Map();
    for (const c of counters) {
      const u = counterUnit(c);
      if (!u) continue;
      const s = scales.get(u) || { min: 0, max: -Infinity, n: 0 };
      s.min = Math.min(s.min, c.min); s.max = Math.max(s.max, c.max); s.n++;
      scales.set(u, s);
    }
    const scaleOf = (c) => {
      const s = counterUnit(c) && scales.get(counterUnit(c));
      return s && s.n > 1 ? { base: s.min, top: s.max, shared: s.n } : { base: Math.min(0, c.min), top: c.max, shared: 1 };
    };
    // Flows: ends looked up by track, lane and start.
    const flows = tl.flows || [], nFlows = flows.length / 6;
    const flowAt = new Map();
    for (let f = 0; f < nFlows; f++) {
      for (const e of [0, 3]) {
        const key = flows[6 * f + e] + ':' + flows[6 * f + e + 1] + ':' + flows[6 * f + e + 2];
        (flowAt.get(key) || flowAt.set(key, []).get(key)).push(f);
      }
    }

    // Rows: pinned threads, then each plane (host first, then each device's
    // streams): a heading, its counters, then its threads, busiest first.
    let rows = [], height = 0, laneY = [];
    function layout() {
      rows = [];
      laneY = tracks.map(() => []);
      let y = AXIS;
      const addTrack = (ti) => {
        const t = tracks[ti];
        rows.push({ kind: 'head', y, ti, track: t });
        y += HEAD;
        if (!state[ti].collapsed) {
          t.lanes.forEach((levels, li) => { laneY[ti][li] = y; rows.push({ kind: 'lane', y, ti, li, levels }); y += LANE; });
        }
        y += GAP / 2;
      };
      const pinned = tracks.map((t, ti) => ti).filter((ti) => state[ti].pinned && !state[ti].hidden);
      if (pinned.length) {
        rows.push({ kind: 'group', y, plane: null, label: `Pinned (${pinned.length})` });
        y += HEAD;
        pinned.forEach(addTrack);
      }
      for (const p of planes) {
        const its = tracks.map((t, ti) => ti).filter((ti) => tracks[ti].plane === p);
        const cs = counters.map((c, ci) => ci).filter((ci) => counters[ci].plane === p);
        const events = its.reduce((n, ti) => n + tracks[ti].events, 0);
        const hidden = its.filter((ti) => state[ti].hidden).length;
        rows.push({ kind: 'group', y, plane: p, label: `${p}  (${its.length} thread${its.length === 1 ? '' : 's'}, ${events} events` +
          (cs.length ? `, ${cs.length} counter${cs.length === 1 ? '' : 's'}` : '') + (hidden ? `, ${hidden} hidden` : '') + ')' });
        y += HEAD;
        if (planeCollapsed.has(p)) continue;
        for (const ci of cs) {
          rows.push({ kind: 'chead', y, ci, counter: counters[ci] });
          y += HEAD;
          rows.push({ kind: 'counter', y, ci, levels: counters[ci].levels });
          y += COUNTER + GAP;
        }
        for (const ti of its) if (!state[ti].pinned && !state[ti].hidden) addTrack(ti);
      }
      height = y + GAP;
      spacer.style.height = height + 'px';
      // The canvas as tall as its lanes, up to most of the window.
      scroll.style.height = Math.min(height + 2, Math.round(window.innerHeight * 0.7)) + 'px';
      const hiddenN = state.filter((s) => s.hidden).length;
      $('tl-hidden').hidden = !hiddenN;
      $('tl-hidden').textContent = `show ${hiddenN} hidden thread${hiddenN === 1 ? '' : 's'}`;
      if (width) resize();
    }
    const rowHeight = (r) => (r.kind === 'counter' ? COUNTER : r.kind === 'lane' ? LANE : HEAD);
    function rowAt(yy) {
      let lo = 0, hi = rows.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (rows[m].y <= yy) lo = m + 1; else hi = m; }
      const r = rows[lo - 1];
      return r && yy < r.y + rowHeight(r) ? r : null;
    }

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
      d = spans(off, len, n, tracks[ti].at_ns, th);
      cache.set(key, d);
      return d;
    }
    // `n` spans of a level from byte `from` (`len` bytes), the first one's
    // gap from `prev` (ns); a level above 0 (threshold `th`) has counts.
    function spans(from, len, n, prev, th) {
      const start = new Float64Array(n), end = new Float64Array(n), name = new Uint32Array(n), detail = new Uint32Array(n),
        count = new Uint32Array(n);
      const { varint, zigzag } = reader(from, len);
      for (let i = 0; i < n; i++) {
        start[i] = prev + zigzag();
        end[i] = start[i] + varint();
        name[i] = varint();
        detail[i] = varint();
        count[i] = th > 0 ? varint() : 1;
        prev = end[i];
      }
      return { start, end, name, detail, count, threshold: th };
    }
    // A big level decodes by chunks of chunk_spans spans, from its marks:
    // a view of a few events decodes a chunk, not the lane.
    const K = tl.chunk_spans || 8192;
    function decodeChunk(ti, li, k, c) {
      const key = ti + ':' + li + ':' + k + ':' + c;
      let d = cache.get(key);
      if (d) return d;
      const [th, n, off, len, marks] = tracks[ti].lanes[li][k];
      const chunks = Math.ceil(n / K);
      const from = off + marks[2 * c], to = c + 1 < chunks ? off + marks[2 * c + 2] : off + len;
      d = spans(from, to - from, Math.min(K, n - c * K), tracks[ti].at_ns + marks[2 * c + 1], th);
      cache.set(key, d);
      return d;
    }
    // The decoded pieces of a level that hold [a, b]: the chunk of the last
    // mark at or before a (a span that covers a starts in it) to that of b.
    function pieces(ti, li, k, a, b) {
      const level = tracks[ti].lanes[li][k];
      const marks = level[4];
      if (!marks) return [decode(ti, li, k)];
      if (cache.has(ti + ':' + li + ':' + k)) return [cache.get(ti + ':' + li + ':' + k)];
      const chunks = marks.length / 2, at = tracks[ti].at_ns;
      const find = (t) => { let lo = 0, hi = chunks; while (lo < hi) { const m = (lo + hi) >> 1; if (at + marks[2 * m + 1] <= t) lo = m + 1; else hi = m; } return Math.max(0, lo - 1); };
      const out = [];
      for (let c = Math.max(0, find(a) - 1), e = find(b); c <= e; c++) out.push(decodeChunk(ti, li, k, c));
      return out;
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
    const fmtValue = (c, v) => (c.bytes ? fmtBytes(v) : (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)))) +
      (counterUnit(c) === 'percent' ? ' %' : ''));
    // The index of the last point at or before t (-1: none).
    function lastAtOrBefore(ts, t) {
      let lo = 0, hi = ts.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (ts[m] <= t) lo = m + 1; else hi = m; }
      return lo - 1;
    }
    function firstAtOrAfter(ts, t) {
      let lo = 0, hi = ts.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (ts[m] < t) lo = m + 1; else hi = m; }
      return lo;
    }
    // A step line over a filled area, on its unit's shared scale; at coarser
    // levels each point also draws its range.
    function drawCounter(r, ry, nsPerPx) {
      const c = counters[r.ci];
      const k = levelFor(r.levels, nsPerPx);
      const d = decodeCounter(r.ci, k);
      const sc = scaleOf(c);
      const base = sc.base, span = sc.top - base || 1;
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
      // The scale, in the gutter.
      ctx.fillStyle = '#555';
      ctx.fillText(fmtValue(c, sc.top), 4, ry + 6);
      ctx.fillText(fmtValue(c, base), 4, ry + COUNTER - 6);
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

    // ---- search, selection, range -------------------------------------------------
    let query = '', matchName = null, matchCount = 0, matches = null, matchAt = -1;
    let selected = null;  // { ti, li, start }: an event
    let range = null;     // [a, b] ns

    const stats = { drawn: 0, maxLevel: 0, lanesDrawn: 0, draws: 0, countersDrawn: 0, counterPoints: 0, flowsDrawn: 0 };
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
    function drawHead(r, ry) {
      if (r.kind === 'group') {
        ctx.fillStyle = '#d9e2ec';
        ctx.fillRect(0, ry, width, HEAD);
        ctx.fillStyle = '#102a43';
        ctx.font = 'bold 11px system-ui, sans-serif';
        ctx.fillText(`${r.plane !== null && planeCollapsed.has(r.plane) ? '▸' : '▾'} ${r.label}`, 4, ry + HEAD / 2);
        ctx.font = '11px system-ui, sans-serif';
        return;
      }
      if (r.kind === 'chead') {
        const c = r.counter, sc = scaleOf(c);
        ctx.fillStyle = '#eef3ee';
        ctx.fillRect(0, ry, width, HEAD);
        ctx.fillStyle = '#222';
        ctx.fillText(`${c.name}  (counter: ${c.samples} samples, ` +
          `${c.min < 0 ? `lowest ${fmtValue(c, c.min)}, ` : ''}highest ${fmtValue(c, c.max)}` +
          (sc.shared > 1 ? `; scale shared by ${sc.shared} ${counterUnit(c)} counters, up to ${fmtValue(c, sc.top)}` : '') + ')', 18, ry + HEAD / 2);
        return;
      }
      const t = r.track, st = state[r.ti];
      ctx.fillStyle = st.pinned ? '#fff4d6' : '#f0f0f3';
      ctx.fillRect(0, ry, width, HEAD);
      ctx.fillStyle = '#444';
      ctx.fillText(st.collapsed ? '▸' : '▾', 4, ry + HEAD / 2);
      ctx.fillText(st.pinned ? '★' : '☆', 2 + ICON + 2, ry + HEAD / 2);
      ctx.fillText('×', 2 + 2 * ICON + 4, ry + HEAD / 2);
      ctx.fillStyle = '#222';
      // Thread ids tell apart threads of one name (ids past 2^53 are approximate here).
      const id = t.id && !t.name.includes(String(t.id)) ? ` [${t.id}]` : '';
      ctx.fillText(`${t.name}${id}  (${t.events} events${t.hidden ? `, ${t.hidden} nested too deep, not drawn` : ''}` +
        `${st.collapsed ? `, ${t.lanes.length} lanes collapsed` : ''})`, 2 + 3 * ICON + 6, ry + HEAD / 2);
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
      let first = 0;
      { let lo = 0, hi = rows.length; while (lo < hi) { const m = (lo + hi) >> 1; if (rows[m].y + COUNTER < top) lo = m + 1; else hi = m; } first = lo; }
      for (let ri = first; ri < rows.length; ri++) {
        const r = rows[ri];
        const ry = r.y - top;
        if (ry > viewH) break;
        if (ry + rowHeight(r) < AXIS) continue;
        if (r.kind === 'group' || r.kind === 'chead' || r.kind === 'head') { drawHead(r, ry); continue; }
        if (r.kind === 'counter') {
          const got = drawCounter(r, ry, nsPerPx);
          countersDrawn++;
          counterPoints += got.points;
          continue;
        }
        const k = levelFor(r.levels, nsPerPx);
        maxLevel = Math.max(maxLevel, k);
        lanesDrawn++;
        let lastPx = -1;
        for (const d of pieces(r.ti, r.li, k, t0, t1)) for (let i = firstEndingAfter(d.end, t0); i < d.start.length && d.start[i] <= t1; i++) {
          const x = GUTTER + (d.start[i] - t0) / nsPerPx;
          const x2 = GUTTER + (d.end[i] - t0) / nsPerPx;
          const xa = Math.max(GUTTER, x), xb = Math.min(width, Math.max(x2, x + 1));
          const hit = matchName && matchName[d.name[i]];
          if (xb <= lastPx && xb - xa < 1 && !hit) continue;  // a pixel already covered
          const nm = names[d.name[i]] || '';
          const h = hue(nm);
          // Searching: the matches in colour, the rest pale.
          ctx.fillStyle = matchName && !hit ? `hsl(${h},15%,90%)` : `hsl(${h},55%,${d.count[i] > 1 ? 72 : 62}%)`;
          ctx.fillRect(xa, ry + 1, Math.max(1, xb - xa), LANE - 2);
          if (hit) { ctx.strokeStyle = '#d00'; ctx.lineWidth = 1.5; ctx.strokeRect(xa, ry + 1, Math.max(1, xb - xa), LANE - 2); ctx.lineWidth = 1; }
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
        if (selected && selected.ti === r.ti && selected.li === r.li) {
          const x = GUTTER + (selected.start - t0) / nsPerPx, x2 = GUTTER + (selected.end - t0) / nsPerPx;
          if (x2 >= GUTTER && x <= width) {
            ctx.strokeStyle = '#000'; ctx.lineWidth = 2;
            ctx.strokeRect(Math.max(GUTTER, x), ry + 1, Math.max(2, Math.min(width, x2) - Math.max(GUTTER, x)), LANE - 2);
            ctx.lineWidth = 1;
          }
        }
      }
      stats.flowsDrawn = drawFlows(top, nsPerPx);
      if (range) {
        const xa = Math.max(GUTTER, GUTTER + (range[0] - t0) / nsPerPx), xb = Math.min(width, GUTTER + (range[1] - t0) / nsPerPx);
        if (xb >= GUTTER && xa <= width) {
          ctx.fillStyle = 'rgba(30,90,200,0.12)';
          ctx.fillRect(xa, AXIS, Math.max(1, xb - xa), viewH - AXIS);
          ctx.strokeStyle = 'rgba(30,90,200,0.8)';
          ctx.beginPath(); ctx.moveTo(xa, AXIS); ctx.lineTo(xa, viewH); ctx.moveTo(xb, AXIS); ctx.lineTo(xb, viewH); ctx.stroke();
        }
      }
      // Axis and gutter over the spans.
      ctx.fillStyle = '#fff';
      ctx.fillRect(0, 0, width, AXIS);
      ctx.fillStyle = '#333';
      ctx.strokeStyle = '#ccc';
      const step = niceStep((t1 - t0) / 8);
      const ticks = [];
      for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
        const x = GUTTER + (t - t0) / nsPerPx;
        ctx.beginPath(); ctx.moveTo(x, AXIS - 6); ctx.lineTo(x, AXIS); ctx.stroke();
        ticks.push(fmtTick(t, step));
        ctx.fillText(ticks[ticks.length - 1], x + 2, AXIS / 2 - 2);
      }
      stats.ticks = ticks;
      if (range) {
        ctx.fillStyle = '#1e5ac8';
        ctx.fillText(`selected: ${fmtNs(range[1] - range[0])}`, 4, AXIS / 2 - 2);
      }
      ctx.beginPath(); ctx.moveTo(0, AXIS - 0.5); ctx.lineTo(width, AXIS - 0.5); ctx.stroke();
      stats.drawn = drawn; stats.maxLevel = maxLevel; stats.lanesDrawn = lanesDrawn; stats.draws++;
      stats.countersDrawn = countersDrawn; stats.counterPoints = counterPoints;
      if (report.onView) report.onView(t0, t1, plot);  // spyglass view (view.js) loads what is shown
      canvas.dataset.drawn = drawn;
      canvas.dataset.level = maxLevel;
      $('tl-info').textContent = `${fmtNs(t0)} – ${fmtNs(t1)} of ${fmtNs(total)} · ${tl.events} events, ${drawn} spans drawn` +
        (counters.length ? ` · ${counters.length} counter${counters.length > 1 ? 's' : ''}` : '') +
        (nFlows ? ` · ${nFlows} flows` : '');
    }
    // Arrows from a launch to its kernel: those whose ends are both shown
    // and which cross the view.
    // The arrows drawn last, [x1, y1, x2, y2] on the canvas (for the tests: where each starts and ends).
    let arrows = [];
    function drawFlows(top, nsPerPx) {
      arrows = [];
      stats.flowArrows = arrows;
      if (!nFlows) return 0;
      let n = 0;
      ctx.strokeStyle = 'rgba(120,40,160,0.75)';
      ctx.fillStyle = 'rgba(120,40,160,0.9)';
      for (let f = 0; f < nFlows && n < kMaxFlowsDrawn; f++) {
        const a = flows[6 * f + 2], b = flows[6 * f + 5];
        if (a > t1) break;  // by from_ns
        if (Math.max(a, b) < t0) continue;
        const ya = laneY[flows[6 * f]][flows[6 * f + 1]], yb = laneY[flows[6 * f + 3]][flows[6 * f + 4]];
        if (ya === undefined || yb === undefined) continue;
        const x1 = GUTTER + (a - t0) / nsPerPx, x2 = GUTTER + (b - t0) / nsPerPx;
        const y1 = ya - top + LANE / 2, y2 = yb - top + LANE / 2;
        if (Math.max(y1, y2) < AXIS || Math.min(y1, y2) > viewH) continue;
        ctx.beginPath(); ctx.moveTo(x1, y1);
        ctx.bezierCurveTo(x1 + 20, y1, x2 - 20, y2, x2, y2);
        ctx.stroke();
        const dir = y2 >= y1 ? -1 : 1;
        ctx.beginPath(); ctx.moveTo(x2, y2); ctx.lineTo(x2 - 6, y2 + dir * 3); ctx.lineTo(x2 - 6, y2 - dir * 4); ctx.closePath(); ctx.fill();
        arrows.push([x1, y1, x2, y2]);
        n++;
      }
      return n;
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
    const timeAt = (px) => t0 + ((px - GUTTER) * (t1 - t0)) / (width - GUTTER);

    // The event under (px, py): its lane's finest level shown there.
    function eventAt(px, py) {
      if (px < GUTTER) return null;
      const r = rowAt(py + scroll.scrollTop);
      if (!r || r.kind !== 'lane') return null;
      const nsPerPx = (t1 - t0) / (width - GUTTER);
      const k = levelFor(r.levels, nsPerPx);
      const t = timeAt(px);
      for (const d of pieces(r.ti, r.li, k, t - nsPerPx, t + nsPerPx)) {
        const i = firstEndingAfter(d.end, t - nsPerPx);
        if (i < d.start.length && d.start[i] <= t + nsPerPx) return { ti: r.ti, li: r.li, k, i, d };
      }
      return null;
    }
    function tipAt(px, py) {
      if (px < GUTTER) return null;
      const yy = py + scroll.scrollTop;
      const r = rowAt(yy);
      if (r && r.kind === 'counter') {
        const nsPerPx = (t1 - t0) / (width - GUTTER);
        const c = counters[r.ci], d = decodeCounter(r.ci, levelFor(r.levels, nsPerPx));
        const i = lastAtOrBefore(d.t, timeAt(px));
        if (i < 0) return null;
        const rg = d.threshold > 0 && d.hi[i] > d.lo[i] ? `\n(${fmtValue(c, d.lo[i])} – ${fmtValue(c, d.hi[i])} within ${fmtNs(d.threshold)})` : '';
        return `${c.name}: ${fmtValue(c, d.last[i])}${rg}\nat ${fmtNs(d.t[i])}`;
      }
      const e = eventAt(px, py);
      if (!e) return null;
      const { d, i } = e;
      const nm = names[d.name[i]] || '';
      const what = d.count[i] > 1 ? `${d.count[i]} events (longest: ${nm}) over` : nm + '\n';
      const more = d.detail[i] ? '\n' + (tl.details[d.detail[i] - 1] || '') : '';
      return `${what} ${fmtNs(d.end[i] - d.start[i])}\nat ${fmtNs(d.start[i])}${more}`;
    }

    // ---- the details panel ----------------------------------------------------------
    const panel = $('tl-details');
    function kv(rowsKv) {
      const t = el('table', { class: 'kv' });
      for (const [k, v, field] of rowsKv) {
        const tr = el('tr');
        tr.appendChild(el('th', {}, k));
        const td = el('td', field ? { 'data-field': field } : {});
        if (v instanceof Node) td.appendChild(v); else td.textContent = v;
        tr.appendChild(td);
        t.appendChild(tr);
      }
      return t;
    }
    // The span of lane `li` of track `ti` (finest level) that holds time t.
    function spanHolding(ti, li, t) {
      for (const d of pieces(ti, li, 0, t, t)) {
        const i = lastAtOrBefore(d.start, t);
        if (i >= 0 && d.end[i] >= t) return { d, i };
      }
      return null;
    }
    // The span of lane li starting at `start` (else the last before it).
    function spanStarting(ti, li, start) {
      let best = null;
      for (const d of pieces(ti, li, 0, start, start)) {
        const i = lastAtOrBefore(d.start, start);
        if (i >= 0) best = { d, i };
      }
      return best;
    }
    function link(text, fn) {
      const a = el('a', { href: '#', class: 'tl-link' }, text);
      a.onclick = (ev) => { ev.preventDefault(); fn(); };
      return a;
    }
    function eventLabel(ti, li, d, i) {
      return `${names[d.name[i]]} (${fmtNs(d.end[i] - d.start[i])} at ${fmtNs(d.start[i])}, ${tracks[ti].name} lane ${li})`;
    }
    // Opens the panel on the event of lane `li` of `ti` starting at `start`
    // (its finest level kept).
    function select(ti, li, start, opts) {
      const sp = spanStarting(ti, li, start) || (() => { const d = pieces(ti, li, 0, start, start)[0]; return d && d.start.length ? { d, i: 0 } : null; })();
      if (!sp) return null;
      const { d, i } = sp;
      selected = { ti, li, start: d.start[i], end: d.end[i] };
      const dur = d.end[i] - d.start[i];
      // Self: less the next lane's spans inside it.
      let child = 0;
      if (li + 1 < tracks[ti].lanes.length) {
        for (const c of pieces(ti, li + 1, 0, d.start[i], d.end[i]))
          for (let j = firstAtOrAfter(c.start, d.start[i]); j < c.start.length && c.start[j] < d.end[i]; j++)
            child += Math.min(c.end[j], d.end[i]) - c.start[j];
      }
      const nm = names[d.name[i]] || '';
      panel.textContent = '';
      panel.hidden = false;
      panel.dataset.kind = 'event';
      const head = el('div', { class: 'tl-panel-head' });
      head.appendChild(el('b', {}, 'Event'));
      head.appendChild(link('zoom to it', () => setView(d.start[i] - dur, d.end[i] + dur)));
      head.appendChild(link('close', () => { panel.hidden = true; selected = null; redraw(); }));
      panel.appendChild(head);
      const items = [['name', nm, 'name'], ['thread', `${tracks[ti].plane} · ${tracks[ti].name}`, 'thread'],
        ['start', fmtNs(d.start[i]), 'start'], ['duration', fmtNs(dur), 'duration']];
      if (d.count[i] > 1) items.push(['merged', `${d.count[i]} events merged (the page was coarsened here: ${fmtNs(d.threshold)})`, 'merged']);
      else items.push(['self time', fmtNs(Math.max(0, dur - child)), 'self']);
      items.push(['arguments', d.detail[i] ? tl.details[d.detail[i] - 1] || '' : '(none)', 'args']);
      items.push(['events of this name', `${nameEvents[d.name[i]] || 0} in the run`, 'name_events']);
      // Its name on this thread: count, total, mean.
      // (Read from the whole thread: left to the range aggregate past 1M spans.)
      if (tracks[ti].lanes.reduce((x, lv) => x + lv[0][1], 0) <= 1000000) {
        let n = 0, sum = 0;
        tracks[ti].lanes.forEach((lv, l) => { const x = decode(ti, l, 0); for (let j = 0; j < x.name.length; j++) if (x.name[j] === d.name[i]) { n += x.count[j]; sum += x.end[j] - x.start[j]; } });
        items.push(['on this thread', `${n} events, ${fmtNs(sum)} in all, ${fmtNs(n ? sum / n : 0)} mean`, 'thread_stats']);
      } else {
        items.push(['on this thread', 'a busy thread: select a range for its aggregate', 'thread_stats']);
      }
      // Enclosing events, innermost first.
      const up = el('div', { 'data-field': 'enclosing' });
      for (let l = li - 1; l >= 0; l--) {
        const h = spanHolding(ti, l, d.start[i]);
        if (!h) continue;
        const row = el('div');
        row.appendChild(link(eventLabel(ti, l, h.d, h.i), () => { select(ti, l, h.d.start[h.i]); }));
        row.dataset.name = names[h.d.name[h.i]];
        up.appendChild(row);
      }
      if (!up.childNodes.length) up.textContent = '(none)';
      items.push(['enclosing', up]);
      // Flow partners (a launch and its kernel).
      const partners = el('div', { 'data-field': 'flows' });
      for (const f of flowAt.get(ti + ':' + li + ':' + d.start[i]) || []) {
        const isFrom = flows[6 * f] === ti && flows[6 * f + 1] === li && flows[6 * f + 2] === d.start[i];
        const o = isFrom ? 3 : 0;
        const pt = flows[6 * f + o], pl = flows[6 * f + o + 1], ps = flows[6 * f + o + 2];
        const h = spanHolding(pt, pl, ps);
        const row = el('div');
        row.appendChild(document.createTextNode(isFrom ? 'to ' : 'from '));
        row.appendChild(link(h ? eventLabel(pt, pl, h.d, h.i) : `${tracks[pt].name} at ${fmtNs(ps)}`, () => {
          reveal(pt);
          const ph = spanStarting(pt, pl, ps);
          const w = Math.max(ph ? ph.d.end[ph.i] - ph.d.start[ph.i] : 0, t1 - t0);
          setView(ps - w / 2, ps + w / 2);
          select(pt, pl, ps);
        }));
        row.dataset.name = h ? names[h.d.name[h.i]] : '';
        row.dataset.track = tracks[pt].name;
        row.dataset.ns = ps;
        partners.appendChild(row);
      }
      if (!partners.childNodes.length) partners.textContent = '(none)';
      items.push(['flow', partners]);
      panel.appendChild(kv(items));
      if (!(opts && opts.quiet)) redraw();
      return selected;
    }

    // Aggregate of the events that start in [a, b), by name, as `spyglass
    // summary` counts them: per thread, nesting by start (longest first),
    // self = its time less its direct children's; a name's total counts
    // only its outermost event (recursion).
    function aggregate(a, b) {
      const by = new Map();
      let coarse = false;
      const open = new Int32Array(names.length);
      for (let ti = 0; ti < tracks.length; ti++) {
        const L = tracks[ti].lanes.length;
        const ds = [], pos = [], stop = [];
        for (let li = 0; li < L; li++) {
          const d = decode(ti, li, 0);
          if (d.threshold > 0) coarse = true;
          ds.push(d); pos.push(firstAtOrAfter(d.start, a)); stop.push(firstAtOrAfter(d.start, b));
        }
        const stack = [];  // { end, dur, child, name, count }
        const pop = () => {
          const o = stack.pop();
          let g = by.get(o.name);
          if (!g) by.set(o.name, (g = { count: 0, total: 0, self: 0, calls: 0 }));
          g.count += o.count;
          if (--open[o.name] === 0) g.total += o.dur;
          g.calls += o.dur;
          g.self += o.dur - Math.min(o.child, o.dur);
        };
        for (;;) {
          let best = -1, bs = 0, bd = 0;
          for (let li = 0; li < L; li++) {
            if (pos[li] >= stop[li]) continue;
            const d = ds[li], j = pos[li], s = d.start[j], du = d.end[j] - s;
            if (best < 0 || s < bs || (s === bs && du > bd)) { best = li; bs = s; bd = du; }
          }
          if (best < 0) break;
          const d = ds[best], j = pos[best]++;
          const end = bs + bd;
          while (stack.length && stack[stack.length - 1].end <= bs) pop();
          if (stack.length) { const p = stack[stack.length - 1]; p.child += Math.min(end, p.end) - bs; }
          stack.push({ end, dur: bd, child: 0, name: d.name[j], count: d.count[j] });
          open[d.name[j]]++;
        }
        while (stack.length) pop();
      }
      const out = [...by.entries()].map(([n, g]) => ({ name: names[n], count: g.count, total_ns: g.total, self_ns: g.self,
        mean_ns: g.count ? g.calls / g.count : 0 }));
      out.sort((x, y) => y.total_ns - x.total_ns || (x.name < y.name ? -1 : 1));
      return { rows: out, coarse };
    }
    // Counters over [a, b]: the value at each end, the change and the
    // highest within (memory live and allocated in the range, per call
    // site where the trace has per-site counters).
    function counterRange(a, b) {
      return counters.map((c, ci) => {
        const d = decodeCounter(ci, 0);
        const ia = lastAtOrBefore(d.t, a), ib = lastAtOrBefore(d.t, b);
        const va = ia >= 0 ? d.last[ia] : 0, vb = ib >= 0 ? d.last[ib] : 0;
        let hi = va;
        for (let i = Math.max(ia, 0); i <= ib; i++) hi = Math.max(hi, d.hi[i]);
        return { plane: c.plane, name: c.name, bytes: c.bytes, at_start: va, at_end: vb, change: vb - va, highest: hi, coarse: d.threshold > 0 };
      });
    }
    function selectRange(a, b, opts) {
      if (b < a) [a, b] = [b, a];
      range = [a, b];
      const t = performance.now();
      const agg = aggregate(a, b);
      const ms = performance.now() - t;
      panel.textContent = '';
      panel.hidden = false;
      panel.dataset.kind = 'range';
      const head = el('div', { class: 'tl-panel-head' });
      head.appendChild(el('b', {}, `Range ${fmtNs(a)} – ${fmtNs(b)} (${fmtNs(b - a)})`));
      head.appendChild(link('zoom to it', () => setView(a, b)));
      head.appendChild(link('clear', () => { range = null; panel.hidden = true; redraw(); }));
      panel.appendChild(head);
      panel.appendChild(el('div', { class: 'more' }, `events that start in the range, by name, as spyglass summary counts them` +
        (agg.coarse ? '; approximate: some lanes were coarsened in this page (merged spans count under their longest event\'s name)' : '')));
      const t2 = table(agg.rows, 'range-agg', ['name', 'count', 'total_ns', 'self_ns', 'mean_ns']);
      panel.appendChild(t2);
      if (agg.rows.length > kMaxRows) panel.appendChild(el('div', { class: 'more' }, `${agg.rows.length - kMaxRows} more names`));
      const cr = counterRange(a, b);
      if (cr.length) {
        panel.appendChild(el('h4', {}, 'Counters in the range (memory: live at each end, allocated net, highest)'));
        panel.appendChild(table(cr.map((c) => {
          const f = (v) => (c.bytes ? fmtBytes(v) : String(Number(v.toPrecision(6))));
          return { plane: c.plane, counter: c.name, at_start: f(c.at_start), at_end: f(c.at_end), change: (c.change > 0 ? '+' : '') + f(c.change), highest: f(c.highest) };
        }), 'range-counters'));
      }
      let cpu = [];
      if (cpuSamples.length) {
        panel.appendChild(el('h4', {}, 'CPU samples that start in the range'));
        cpu = cpuFlamesInRange(panel, a, b);
        if (!cpu.some((c) => c.samples)) panel.appendChild(el('div', { class: 'more' }, 'none'));
      }
      if (!(opts && opts.quiet)) redraw();
      return { rows: agg.rows, coarse: agg.coarse, counters: cr, cpu, ms };
    }

    // Search by name: the count is exact (every event of the run), the
    // list for next/previous holds the events of the page's finest levels.
    function search(q) {
      query = q;
      matches = null; matchAt = -1;
      if (!q) { matchName = null; matchCount = 0; $('tl-count').textContent = ''; redraw(); return 0; }
      const lq = q.toLowerCase();
      matchName = new Uint8Array(names.length);
      matchCount = 0;
      for (let n = 0; n < names.length; n++) if (names[n].toLowerCase().includes(lq)) { matchName[n] = 1; matchCount += nameEvents[n] || 0; }
      $('tl-count').textContent = `${matchCount} match${matchCount === 1 ? '' : 'es'}`;
      redraw();
      return matchCount;
    }
    function matchList() {
      if (matches) return matches;
      const st = [], where = [];
      outer: for (let ti = 0; ti < tracks.length; ti++) {
        for (let li = 0; li < tracks[ti].lanes.length; li++) {
          const d = decode(ti, li, 0);
          for (let i = 0; i < d.name.length; i++) {
            if (!matchName[d.name[i]]) continue;
            if (st.length >= kMaxMatches) break outer;
            st.push(d.start[i]); where.push(ti * 65536 + li);
          }
        }
      }
      const idx = Array.from(st.keys()).sort((x, y) => st[x] - st[y] || where[x] - where[y]);
      matches = { start: idx.map((i) => st[i]), where: idx.map((i) => where[i]) };
      return matches;
    }
    function step(dir) {
      if (!matchName) return null;
      const m = matchList();
      if (!m.start.length) return null;
      matchAt = matchAt < 0 ? (dir > 0 ? 0 : m.start.length - 1) : (matchAt + dir + m.start.length) % m.start.length;
      const ti = Math.floor(m.where[matchAt] / 65536), li = m.where[matchAt] % 65536;
      reveal(ti);
      const s = select(ti, li, m.start[matchAt], { quiet: true });
      const w = Math.max(t1 - t0 > 50 * (s.end - s.start) ? (s.end - s.start) * 20 : t1 - t0, 1000);
      setView(s.start - w / 2 + (s.end - s.start) / 2, s.start + w / 2 + (s.end - s.start) / 2);
      $('tl-count').textContent = `${matchAt + 1} of ${matchCount} match${matchCount === 1 ? '' : 'es'}` +
        (m.start.length < matchCount ? ` (${m.start.length} in the page's finest levels)` : '');
      scrollToTrack(ti);
      const sp = spanStarting(ti, li, s.start);
      return { index: matchAt, name: sp ? names[sp.d.name[sp.i]] : '', start: s.start };
    }
    // Makes a thread shown (its plane open, itself not hidden).
    function reveal(ti) {
      let changed = false;
      if (state[ti].hidden) { state[ti].hidden = false; changed = true; }
      if (planeCollapsed.has(tracks[ti].plane) && !state[ti].pinned) { planeCollapsed.delete(tracks[ti].plane); changed = true; }
      if (state[ti].collapsed) { state[ti].collapsed = false; changed = true; }
      if (changed) layout();
    }
    function scrollToTrack(ti) {
      const r = rows.find((x) => x.kind === 'head' && x.ti === ti);
      if (!r) return;
      if (r.y < scroll.scrollTop + AXIS || r.y + HEAD * 3 > scroll.scrollTop + viewH) scroll.scrollTop = Math.max(0, r.y - AXIS - HEAD);
      redraw();
    }

    // ---- the mouse ------------------------------------------------------------------
    canvas.addEventListener('wheel', (e) => {
      if (e.shiftKey) return;  // the scroll box scrolls the threads
      e.preventDefault();
      const r = canvas.getBoundingClientRect();
      zoom(Math.pow(1.0015, e.deltaY), e.clientX - r.left);
    }, { passive: false });
    // A drag pans; shift+drag, or a drag on the time axis, selects a range;
    // a click selects an event or works a heading.
    let drag = null;
    canvas.addEventListener('mousedown', (e) => {
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left, y = e.clientY - r.top;
      drag = { x0: e.clientX, x: e.clientX, px: x, py: y, mode: null, select: e.shiftKey || y < AXIS };
    });
    window.addEventListener('mouseup', (e) => {
      if (!drag) return;
      const d = drag;
      drag = null;
      canvas.style.cursor = 'grab';
      if (d.mode === 'select') { selectRange(range[0], range[1]); return; }
      if (d.mode === null && e.target === canvas) click(d.px, d.py);
    });
    window.addEventListener('mousemove', (e) => {
      if (drag) {
        if (drag.mode === null && Math.abs(e.clientX - drag.x0) > 3) {
          drag.mode = drag.select ? 'select' : 'pan';
          canvas.style.cursor = drag.mode === 'pan' ? 'grabbing' : 'col-resize';
        }
        if (drag.mode === 'pan') { pan(drag.x - e.clientX); drag.x = e.clientX; }
        if (drag.mode === 'select') {
          const r = canvas.getBoundingClientRect();
          const a = timeAt(Math.max(GUTTER, drag.px)), b = timeAt(Math.max(GUTTER, e.clientX - r.left));
          range = [Math.max(0, Math.min(a, b)), Math.min(total, Math.max(a, b))];
          redraw();
        }
        tip.hidden = true;
        return;
      }
      if (e.target !== canvas) { tip.hidden = true; return; }
      const r = canvas.getBoundingClientRect();
      const hit = tipAt(e.clientX - r.left, e.clientY - r.top);
      if (!hit) { tip.hidden = true; return; }
      tip.textContent = hit;
      tip.style.left = e.clientX + 12 + 'px';
      tip.style.top = e.clientY + 12 + 'px';
      tip.hidden = false;
    });
    function click(px, py) {
      const r = rowAt(py + scroll.scrollTop);
      if (!r) return;
      if (r.kind === 'group') {
        if (r.plane === null) return;
        if (planeCollapsed.has(r.plane)) planeCollapsed.delete(r.plane); else planeCollapsed.add(r.plane);
        layout();
        return;
      }
      if (r.kind === 'head') {
        const st = state[r.ti];
        if (px < 2 + ICON) st.collapsed = !st.collapsed;
        else if (px < 2 + 2 * ICON + 2) st.pinned = !st.pinned;
        else if (px < 2 + 3 * ICON + 4) st.hidden = true;
        else st.collapsed = !st.collapsed;
        layout();
        return;
      }
      const e = eventAt(px, py);
      if (e) select(e.ti, e.li, e.d.start[e.i]);
    }
    scroll.addEventListener('scroll', redraw);
    window.addEventListener('resize', resize);
    $('tl-in').onclick = () => zoom(0.5, GUTTER + (width - GUTTER) / 2);
    $('tl-out').onclick = () => zoom(2, GUTTER + (width - GUTTER) / 2);
    $('tl-reset').onclick = () => setView(0, total);
    $('tl-hidden').onclick = () => { state.forEach((s) => { s.hidden = false; }); layout(); };
    const box = $('tl-search');
    box.addEventListener('input', () => search(box.value));
    box.addEventListener('keydown', (e) => { if (e.key === 'Enter') { step(e.shiftKey ? -1 : 1); e.preventDefault(); } });
    $('tl-next').onclick = () => step(1);
    $('tl-prev').onclick = () => step(-1);
    canvas.tabIndex = 0;
    canvas.addEventListener('keydown', (e) => {
      const c = GUTTER + (width - GUTTER) / 2;
      if (e.key === 'w') zoom(0.8, c);
      else if (e.key === 's') zoom(1.25, c);
      else if (e.key === 'a') pan(-(width - GUTTER) / 10);
      else if (e.key === 'd') pan((width - GUTTER) / 10);
      else if (e.key === '0') setView(0, total);
      else if (e.key === 'Escape') { range = null; selected = null; panel.hidden = true; redraw(); }
      else if (e.key === '/') box.focus();
      else return;
      e.preventDefault();
    });
    layout();
    resize();
    const trackIndex = (name) => tracks.findIndex((t) => t.name === name);
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
      headBand: (name) => {
        const r = rows.find((x) => x.kind === 'head' && tracks[x.ti].name === name);
        return r ? [r.y - scroll.scrollTop, HEAD] : null;
      },
      groupBand: (plane) => {
        const r = rows.find((x) => x.kind === 'group' && x.plane === plane);
        return r ? [r.y - scroll.scrollTop, HEAD] : null;
      },
      // The rows top to bottom: headings and lanes, as drawn.
      rows: () => rows.map((r) => ({ kind: r.kind, y: r.y, name: r.kind === 'head' || r.kind === 'lane' ? tracks[r.ti].name :
        r.kind === 'group' ? r.label : r.kind === 'chead' || r.kind === 'counter' ? counters[r.ci].name : '', lane: r.li })),
      height: () => height, canvasHeight: () => viewH, scrollTo: (y) => { scroll.scrollTop = y; draw(); },
      state: (name) => ({ ...state[trackIndex(name)] }),
      search: (q) => { $('tl-search').value = q; return search(q); }, next: () => step(1), prev: () => step(-1),
      selectRange: (a, b) => selectRange(a, b), select: (name, lane, ns) => select(trackIndex(name), lane, ns),
      reveal: (name) => { reveal(trackIndex(name)); scrollToTrack(trackIndex(name)); },
      selected: () => (selected ? { ...selected, track: tracks[selected.ti].name } : null),
      scales: () => counters.map((c) => ({ name: c.name, ...scaleOf(c) })),
      flows: nFlows, draw,
    };
  }

  // ---- flame graphs ---------------------------------------------------------------
  // Views of one set of stacks (root first, each with a value): flame
  // (left-heavy: the largest first), call order (by name), inverted (the
  // allocating frames at the top) and sandwich (one function's callers above
  // it, its callees below); the interpreter's and the import system's frames
  // folded or not; search; a tooltip as soon as the mouse is on a frame.
  const ROW = 18;
  const KIND = ['native', 'python', 'interpreter', 'label'];
  const kindColor = (k, name) => {
    const h = hue(name);
    if (k === 1) return `hsl(${95 + (h % 50)},55%,${62 + (h % 12)}%)`;   // Python: greens
    if (k === 2) return `hsl(0,0%,${78 + (h % 10)}%)`;                   // interpreter: greys
    if (k === 3) return '#c9d6e8';
    return `hsl(${18 + (h % 32)},80%,${60 + (h % 14)}%)`;                // native: oranges
  };
  // A tree from stacks: node arrays, preorder, children in `order`.
  function buildTree(stacks, order, frameKey) {
    const kids = [new Map()], frame = [-1], value = [0], self = [0], parent = [-1], depth = [0];
    for (const s of stacks) {
      let at = 0;
      value[0] += s.value;
      for (const f of s.frames) {
        let c = kids[at].get(f);
        if (c === undefined) {
          c = frame.length;
          kids[at].set(f, c); kids.push(new Map()); frame.push(f); value.push(0); self.push(0); parent.push(at); depth.push(depth[at] + 1);
        }
        value[c] += s.value;
        at = c;
      }
      self[at] += s.value;
    }
    // Preorder with x offsets (in value units), children ordered.
    const n = frame.length, pre = [], x = new Float64Array(n), end = new Int32Array(n);
    const stack = [0];
    while (stack.length) {
      const i = stack.pop();
      if (i < 0) { end[~i] = pre.length; continue; }
      pre.push(i);
      stack.push(~i);
      const cs = [...kids[i].values()];
      order(cs, frame, value);
      let cx = x[i];
      for (const c of cs) { x[c] = cx; cx += value[c]; }
      for (let k = cs.length - 1; k >= 0; k--) stack.push(cs[k]);
    }
    let maxDepth = 0;
    for (let i = 0; i < n; i++) maxDepth = Math.max(maxDepth, depth[i]);
    void frameKey;
    return { frame, value, self, parent, depth, x, pre, end, maxDepth };
  }

  function renderFlame(box, g, index, cls) {
    const S = g.strings;
    const fnOf = (f) => S[g.frame_fn[f]], fileOf = (f) => S[g.frame_file[f]];
    const kindOf = (f) => g.frame_kind[f];
    const loc = (f) => (fileOf(f) ? fileOf(f) + (g.frame_line[f] ? ':' + g.frame_line[f] : '') : '');
    const every = [];
    for (let i = 0, off = 0; i < g.stack_sizes.length; off += g.stack_sizes[i], i++)
      every.push({ frames: g.stack_frames.slice(off, off + g.stack_sizes[i]), value: g.stack_values[i],
        thread: g.cpu ? g.stack_thread[i] : 0, annotation: g.cpu ? g.stack_annotation[i] : 0 });
    let all = every;
    const fmt = g.unit === 'bytes' ? fmtBytes : g.unit === 'nanoseconds' ? fmtNs : (v) => String(v);
    const pct = (v) => (g.total ? ((100 * v) / g.total).toFixed(1) : '0') + ' %';
    const sec = el('div', { class: cls || 'profile', 'data-title': g.title });
    sec.appendChild(el(cls ? 'h4' : 'h3', {}, `${g.title} — ${fmt(g.total)}${cls ? '' : g.unit === 'bytes' ? ' live' : g.cpu ? ' CPU time' : ' samples'}`));
    if (g.negative_samples) sec.appendChild(el('div', { class: 'more' }, `${g.negative_samples} samples with negative values counted as 0`));
    if (g.hidden_stacks) sec.appendChild(el('div', { class: 'more' }, `${g.hidden_stacks} smaller stacks (${fmt(g.hidden_value)}) are not in this page's flame graph`));
    if (g.sites.length) {
      sec.appendChild(el('div', {}, 'Top allocation sites (first frame past the allocator):'));
      sec.appendChild(table(g.sites.map((s) => ({ site: s.site, [g.unit === 'bytes' ? 'bytes' : 'value']: s.value, count: s.count,
        share: g.total ? s.value / g.total : 0 })), 'sites'));
    }
    const interp = g.frame_kind.filter((k) => k === 2).length;
    const bar = el('div', { class: 'fl-bar' });
    const viewSel = el('select', { class: 'fl-view' });
    for (const [v, t] of [['flame', 'flame (left-heavy)'], ['order', 'call tree (by name)'], ['inverted', 'inverted (allocating frames on top)'], ['sandwich', 'sandwich']])
      viewSel.appendChild(el('option', { value: v }, t));
    const fold = el('input', { type: 'checkbox', class: 'fl-fold' });
    fold.checked = g.fold;
    const foldLabel = el('label', { title: 'the interpreter\'s eval loop and call plumbing, runpy and importlib' });
    foldLabel.appendChild(fold);
    foldLabel.appendChild(document.createTextNode(` fold interpreter and import frames (${interp} such frames)`));
    const find = el('input', { type: 'search', class: 'fl-search', placeholder: 'search frames', size: 18 });
    const found = el('span', { class: 'fl-found' });
    // CPU: all threads, one thread, or one annotation (the samples' labels).
    const who = el('select', { class: 'fl-who' });
    if (g.cpu) {
      who.appendChild(el('option', { value: 'all' }, 'all threads'));
      (g.threads || []).forEach((t, k) => { if (t) who.appendChild(el('option', { value: 't' + k }, 'thread ' + t)); });
      (g.annotations || []).forEach((a, k) => { if (a) who.appendChild(el('option', { value: 'a' + k }, 'annotation ' + a)); });
      bar.appendChild(who);
    }
    bar.appendChild(viewSel); bar.appendChild(foldLabel); bar.appendChild(find); bar.appendChild(found);
    const legend = el('span', { class: 'fl-legend' });
    for (const k of [1, 0, 2]) { const sw = el('span', { class: 'fl-swatch' }); sw.style.background = kindColor(k, 'x'); legend.appendChild(sw); legend.appendChild(document.createTextNode(KIND[k] + ' ')); }
    bar.appendChild(legend);
    sec.appendChild(bar);
    const crumbs = el('div', { class: 'fl-crumbs' }, 'click a frame to zoom in, the top bar to zoom out');
    const flame = el('div', { class: 'flame' });
    const flame2 = el('div', { class: 'flame flame-callees' });
    flame2.hidden = true;
    sec.appendChild(crumbs);
    sec.appendChild(flame);
    sec.appendChild(flame2);
    box.appendChild(sec);
    const tip = $('fl-tip');

    let view = 'flame', focusFn = null, query = '', tree = null, tree2 = null, root = 0;
    const fnKey = (f) => fnOf(f) + '\u0000' + fileOf(f);
    // Stacks as the view sees them: folded, inverted, or cut at a function.
    function stacksFor() {
      let st = all;
      if (fold.checked) {
        st = st.map((s) => ({ value: s.value, frames: s.frames.filter((f, i) => kindOf(f) !== 2 || i === s.frames.length - 1) }));
      }
      return st;
    }
    const byValue = (cs, frame, value) => cs.sort((a, b) => value[b] - value[a]);
    const byName = (cs, frame) => cs.sort((a, b) => (fnOf(frame[a]) < fnOf(frame[b]) ? -1 : fnOf(frame[a]) > fnOf(frame[b]) ? 1 : 0));
    function rebuild() {
      const st = stacksFor();
      flame2.hidden = view !== 'sandwich';
      if (view === 'sandwich') {
        if (focusFn === null) {
          // The function with the most self value, until one is clicked.
          const selfBy = new Map();
          for (const s of st) { const f = s.frames[s.frames.length - 1]; if (f !== undefined && kindOf(f) !== 3) selfBy.set(fnKey(f), (selfBy.get(fnKey(f)) || 0) + s.value); }
          let best = null, bv = -1;
          for (const [k, v] of selfBy) if (v > bv) { best = k; bv = v; }
          focusFn = best;
        }
        const callers = [], callees = [];
        for (const s of st) {
          const i = s.frames.findIndex((f) => fnKey(f) === focusFn);
          if (i < 0) continue;
          callers.push({ value: s.value, frames: s.frames.slice(0, i + 1).reverse() });
          callees.push({ value: s.value, frames: s.frames.slice(i) });
        }
        tree = buildTree(callers, byValue);
        tree2 = buildTree(callees, byValue);
      } else {
        const sts = view === 'inverted' ? st.map((s) => ({ value: s.value, frames: s.frames.slice().reverse() })) : st;
        tree = buildTree(sts, view === 'order' ? byName : byValue);
        tree2 = null;
      }
      root = 0;
      draw();
    }
    who.addEventListener('change', () => {
      const v = who.value, k = Number(v.slice(1));
      all = v === 'all' ? every : every.filter((s) => (v[0] === 't' ? s.thread === k : s.annotation === k));
      focusFn = null;
      rebuild();
    });
    const matches = (f) => query && (fnOf(f).toLowerCase().includes(query) || fileOf(f).toLowerCase().includes(query));
    function drawTree(div, t, r) {
      div.textContent = '';
      if (!t) return;
      div.style.height = (t.maxDepth + 1) * ROW + 'px';
      const W = div.clientWidth || 1000;
      const scale = t.value[r] > 0 ? W / t.value[r] : 0;
      const add = (i, left, w, above) => {
        const f = t.frame[i];
        const nm = i === 0 ? (view === 'sandwich' ? (div === flame ? 'callers (inverted)' : 'callees') : 'all') : fnOf(f);
        const attrs = { class: 'fl-node' + (above ? ' fl-above' : ''), 'data-name': nm, 'data-value': t.value[i], 'data-self': t.self[i],
          'data-node': i, 'data-kind': i === 0 ? 'root' : KIND[kindOf(f)], 'data-loc': i === 0 ? '' : loc(f) };
        if (query && i) attrs.class += matches(f) ? ' fl-match' : ' fl-dim';
        const d = el('div', attrs);
        d.style.left = left + 'px'; d.style.width = w + 'px'; d.style.top = t.depth[i] * ROW + 'px';
        d.style.background = i === 0 ? '#ddd' : kindColor(kindOf(f), nm);
        if (w > 30) {
          d.textContent = nm;
          if (i && loc(f) && w > 90) d.appendChild(el('span', { class: 'fl-loc' }, ' ' + loc(f)));
        }
        div.appendChild(d);
      };
      for (let a = t.parent[r]; a >= 0; a = t.parent[a]) add(a, 0, W, true);
      for (let k = t.pre.indexOf(r), stop = t.end[r]; k < stop;) {
        const i = t.pre[k];
        const w = t.value[i] * scale;
        if (w < 1.5) { k = skip(t, k); continue; }  // its children are narrower still
        add(i, (t.x[i] - t.x[r]) * scale, w, false);
        k++;
      }
    }
    // The preorder index past node pre[k]'s subtree.
    function skip(t, k) { return t.end[t.pre[k]]; }
    function draw() {
      drawTree(flame, tree, root);
      if (tree2) drawTree(flame2, tree2, 0);
      else flame2.textContent = '';
      if (view === 'sandwich') {
        const nm = focusFn ? focusFn.split('\u0000')[0] : '(none)';
        crumbs.textContent = `sandwich of ${nm}: its callers above (inverted), its callees below — click a frame to center on its function`;
      } else {
        crumbs.textContent = root === 0 ? 'click a frame to zoom in' : `zoomed to ${fnOf(tree.frame[root])} — click a faded frame above to zoom out`;
      }
      if (query) {
        // What the matching frames hold (each stack once).
        let v = 0;
        for (const s of stacksFor()) if (s.frames.some(matches)) v += s.value;
        found.textContent = `${fmt(v)} (${pct(v)}) under frames matching '${query}'`;
      } else {
        found.textContent = '';
      }
    }
    const nodeOf = (e) => { const d = e.target.closest && e.target.closest('.fl-node'); return d ? { d, t: d.parentNode === flame2 ? tree2 : tree, i: Number(d.dataset.node) } : null; };
    for (const div of [flame, flame2]) {
      div.addEventListener('click', (e) => {
        const n = nodeOf(e);
        if (!n) return;
        if (view === 'sandwich') {
          if (n.i) { focusFn = fnKey(n.t.frame[n.i]); rebuild(); }
          return;
        }
        root = n.i;  // a frame zooms in; a faded one above zooms out to it
        draw();
      });
      // The tooltip at once: no title attribute's delay.
      div.addEventListener('mousemove', (e) => {
        const n = nodeOf(e);
        if (!n) { tip.hidden = true; return; }
        const f = n.t.frame[n.i];
        tip.textContent = n.i === 0 ? `all: ${fmt(n.t.value[0])}` :
          `${fnOf(f)}\n${loc(f) || '(no file)'} · ${KIND[kindOf(f)]}\n${fmt(n.t.value[n.i])} (${pct(n.t.value[n.i])} of all)` +
          (n.t.self[n.i] ? `\nself: ${fmt(n.t.self[n.i])}` : '');
        tip.style.left = e.clientX + 12 + 'px';
        tip.style.top = e.clientY + 12 + 'px';
        tip.hidden = false;
      });
      div.addEventListener('mouseleave', () => { tip.hidden = true; });
    }
    viewSel.addEventListener('change', () => { view = viewSel.value; rebuild(); });
    fold.addEventListener('change', rebuild);
    find.addEventListener('input', () => { query = find.value.toLowerCase(); draw(); });
    rebuild();
    // For tests and the console.
    return {
      setView: (v) => { viewSel.value = v; view = v; rebuild(); },
      setFold: (on) => { fold.checked = on; rebuild(); },
      // CPU: 'all', 't<k>' (thread k) or 'a<k>' (annotation k); the root's total after.
      select: (v) => { who.value = v; who.dispatchEvent(new Event('change')); return tree ? tree.value[0] : 0; },
      search: (q) => { find.value = q; query = q.toLowerCase(); draw(); return found.textContent; },
      sandwich: (fn) => { viewSel.value = 'sandwich'; view = 'sandwich'; focusFn = null; for (let f = 0; f < g.frame_fn.length; f++) if (fnOf(f) === fn) focusFn = fnKey(f); rebuild(); },
      // Each node as drawn: name, file:line, kind, depth, value, self.
      nodes: (which) => {
        const t = which === 2 ? tree2 : tree;
        return t ? t.pre.map((i) => ({ name: i ? fnOf(t.frame[i]) : 'all', loc: i ? loc(t.frame[i]) : '', kind: i ? KIND[kindOf(t.frame[i])] : 'root',
          depth: t.depth[i], value: t.value[i], self: t.self[i] })) : [];
      },
      index,
    };
  }


  // ---- CPU samples of a time range ---------------------------------------------
  // The CPU sampler's samples with their times (data.cpu_samples, per
  // process), decoded once: a range selected on the timeline draws the flame
  // graph of the samples that start in it.
  let cpuSamples = [];
  function decodeCpuSamples(s, bytes) {
    const n = s.samples, t = new Float64Array(n), node = new Uint32Array(n), thread = new Uint32Array(n), cpu = new Float64Array(n);
    let p = 0;
    const varint = () => { let v = 0, mul = 1, b; do { b = bytes[p++]; v += (b & 127) * mul; mul *= 128; } while (b & 128); return v; };
    for (let i = 0, at = s.first_ns; i < n; i++) {
      const z = varint();
      at += z % 2 ? -(z + 1) / 2 : z / 2;
      t[i] = at; node[i] = varint(); thread[i] = varint(); cpu[i] = varint();
    }
    return { ...s, t, node, thread, cpu };
  }
  // Per process with samples in [a, b): its flame graph (renderFlame's data,
  // the nodes as frames) under `box`; what each shows, for tests.
  function cpuFlamesInRange(box, a, b) {
    return cpuSamples.map((s) => {
      let i = 0, hi = s.t.length;
      while (i < hi) { const mid = (i + hi) >> 1; if (s.t[mid] < a) i = mid + 1; else hi = mid; }
      const by = new Map();  // (leaf, thread) -> stack index
      const g = { title: `${s.title}: CPU in the range`, unit: 'nanoseconds', total: 0, strings: s.strings, frame_fn: s.node_fn,
        frame_file: s.node_file, frame_line: s.node_line, frame_kind: s.node_kind, stack_frames: [], stack_sizes: [], stack_values: [],
        stack_counts: [], sites: [], fold: true, cpu: true, threads: s.threads, annotations: [''], stack_thread: [], stack_annotation: [] };
      let count = 0;
      for (; i < s.t.length && s.t[i] < b; i++) {
        const key = s.node[i] * s.threads.length + s.thread[i];
        let k = by.get(key);
        if (k === undefined) {
          const frames = [];
          for (let f = s.node[i]; frames.length < 4096; f = s.node_parent[f] - 1) { frames.push(f); if (!s.node_parent[f]) break; }
          frames.reverse();
          k = g.stack_sizes.length;
          by.set(key, k);
          g.stack_frames.push(...frames); g.stack_sizes.push(frames.length); g.stack_values.push(0); g.stack_counts.push(0);
          g.stack_thread.push(s.thread[i]); g.stack_annotation.push(0);
        }
        g.stack_values[k] += s.cpu[i]; g.stack_counts[k]++; g.total += s.cpu[i]; count++;
      }
      if (!count) return { title: s.title, samples: 0, total_ns: 0, flame: null };
      return { title: s.title, samples: count, total_ns: g.total, flame: renderFlame(box, g, -1, 'range-cpu') };
    });
  }

  // ---- memory over time ---------------------------------------------------------
  // A memory.*.timeline.tsv: live bytes per device over time; a range
  // dragged on it shows, per call site, what was live at its ends, what
  // was allocated in it (net) and the highest, and a flame graph of either.
  function renderMemoryTimeline(box, m) {
    const sec = el('div', { class: 'memtl', 'data-title': m.title });
    sec.appendChild(el('h3', {}, `${m.title}: live bytes over time`));
    const n = m.t.length;
    const every = m.interval_ns ? fmtNs(m.interval_ns) : '?';
    sec.appendChild(el('div', { class: 'more' }, `${n} points, one every ${every} at the end (merged as the run grew); ` +
      `each point names only its top ${m.top_per_point} call sites (a site outside them there shows as —), with stacks of at ` +
      `most 6 frames and no file:line; what was allocated and freed between two points is not recorded, so "allocated" ` +
      `is the net growth of live bytes. Drag on the chart to pick a range.`));
    const W = Math.max(600, Math.min(1300, box.clientWidth || 1000)), H = 150, L = 80, T = 8, B = 20;
    const canvas = el('canvas', { class: 'memtl-chart' });
    const dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.width = W + 'px'; canvas.style.height = H + 'px';
    sec.appendChild(canvas);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const tEnd = n ? Math.max(m.t[n - 1], 1) : 1;
    let top = 1;
    for (let i = 0; i < n; i++) for (const v of m.max[i].concat(m.live[i])) top = Math.max(top, v);
    const xOf = (t) => L + ((W - L - 4) * t) / tEnd, tOf = (x) => Math.min(tEnd, Math.max(0, ((x - L) * tEnd) / (W - L - 4)));
    const yOf = (v) => H - B - ((H - B - T) * v) / top;
    let range = [0, tEnd];
    function chart() {
      ctx.clearRect(0, 0, W, H);
      ctx.font = '10px system-ui, sans-serif';
      ctx.fillStyle = '#555';
      ctx.textBaseline = 'middle';
      ctx.fillText(fmtBytes(top), 4, T + 4);
      ctx.fillText('0 B', 4, H - B);
      ctx.fillText(fmtNs(0), L, H - 6);
      ctx.fillText(fmtNs(tEnd), W - 60, H - 6);
      m.devices.forEach((dev, d) => {
        ctx.beginPath();
        for (let i = 0; i < n; i++) {
          const x = xOf(m.t[i]);
          if (i === 0) ctx.moveTo(x, yOf(m.live[i][d])); else { ctx.lineTo(x, yOf(m.live[i - 1][d])); ctx.lineTo(x, yOf(m.live[i][d])); }
        }
        ctx.strokeStyle = `hsl(${hue(dev)},60%,40%)`;
        ctx.stroke();
        ctx.fillStyle = `hsl(${hue(dev)},60%,40%)`;
        ctx.fillText(`${dev} (peak ${fmtBytes(m.peak[d] || 0)})`, L + 6 + d * 180, T + 4);
      });
      const xa = xOf(range[0]), xb = xOf(range[1]);
      ctx.fillStyle = 'rgba(30,90,200,0.12)';
      ctx.fillRect(xa, T, Math.max(1, xb - xa), H - B - T);
    }
    const weight = el('select', { class: 'memtl-weight' });
    weight.appendChild(el('option', { value: 'end' }, 'flame graph: live at the end of the range'));
    weight.appendChild(el('option', { value: 'grown' }, 'flame graph: allocated in the range (net growth)'));
    const what = el('div', { class: 'memtl-range' });
    sec.appendChild(what);
    sec.appendChild(weight);
    const flameBox = el('div');
    sec.appendChild(flameBox);
    box.appendChild(sec);
    const at = (t) => { let i = -1; while (i + 1 < n && m.t[i + 1] <= t) i++; return i; };
    const siteAt = (i, s) => {
      if (i < 0) return 0;  // before the first point: nothing live
      const e = m.top[i].find((x) => x[0] === s);
      // A point that names fewer sites than it could names every live one.
      return e ? e[1] : m.top[i].length < m.top_per_point ? 0 : null;
    };
    function select(a, b) {
      if (b < a) [a, b] = [b, a];
      range = [a, b];
      chart();
      const ia = at(a), ib = at(b);
      const rows = m.sites.map((site, s) => {
        const va = siteAt(ia, s), vb = siteAt(ib, s);
        let hi = null;
        for (let i = Math.max(ia, 0); i <= ib; i++) { const v = siteAt(i, s); if (v !== null) hi = Math.max(hi === null ? 0 : hi, v); }
        return { s, site: site.stack.split(' <- ')[0] || '(no stack)', device: site.device, at_start: va, at_end: vb,
          allocated: va !== null && vb !== null ? vb - va : null, highest: hi };
      }).filter((r) => r.at_end || r.highest || r.at_start);
      rows.sort((x, y) => (y.at_end || 0) - (x.at_end || 0));
      const f = (v) => (v === null ? '—' : fmtBytes(v));
      what.textContent = '';
      what.appendChild(el('div', {}, `range ${fmtNs(a)} – ${fmtNs(b)}: ` + m.devices.map((d, k) =>
        `${d} ${fmtBytes(ia >= 0 ? m.live[ia][k] : 0)} → ${fmtBytes(ib >= 0 ? m.live[ib][k] : 0)}`).join(', ')));
      what.appendChild(table(rows.map((r) => ({ site: r.site, device: r.device, live_at_start: f(r.at_start), live_at_end: f(r.at_end),
        allocated: r.allocated === null ? '—' : (r.allocated > 0 ? '+' : '') + fmtBytes(r.allocated), highest: f(r.highest) })), 'memtl-sites'));
      // The flame graph of the sites' stacks, root first.
      const strings = [], ids = new Map(), g = { title: weight.value === 'end' ? 'live at the end of the range' : 'allocated in the range (net)',
        unit: 'bytes', total: 0, strings, frame_fn: [], frame_file: [], frame_line: [], frame_kind: [], stack_frames: [], stack_sizes: [],
        stack_values: [], sites: [], fold: false };
      const frameOf = (name) => {
        if (!ids.has(name)) { ids.set(name, g.frame_fn.length); strings.push(name); g.frame_fn.push(strings.length - 1); g.frame_file.push(0); g.frame_line.push(0); g.frame_kind.push(/\.py\b/.test(name) ? 1 : 0); }
        return ids.get(name);
      };
      strings.push('');
      for (const r of rows) {
        const v = weight.value === 'end' ? r.at_end : r.allocated;
        if (!v || v <= 0) continue;
        const fr = (m.sites[r.s].stack || '(no stack)').split(' <- ').reverse().map(frameOf);
        g.stack_frames.push(...fr); g.stack_sizes.push(fr.length); g.stack_values.push(v); g.total += v;
      }
      flameBox.textContent = '';
      renderFlame(flameBox, g, -1, 'memtl-flame');
      return rows.map((r) => ({ site: r.site, at_start: r.at_start, at_end: r.at_end, allocated: r.allocated, highest: r.highest }));
    }
    let drag = null;
    canvas.addEventListener('mousedown', (e) => { const r = canvas.getBoundingClientRect(); drag = tOf(e.clientX - r.left); });
    canvas.addEventListener('mousemove', (e) => {
      if (drag === null) return;
      const r = canvas.getBoundingClientRect();
      range = [Math.min(drag, tOf(e.clientX - r.left)), Math.max(drag, tOf(e.clientX - r.left))];
      chart();
    });
    window.addEventListener('mouseup', (e) => {
      if (drag === null) return;
      const r = canvas.getBoundingClientRect();
      const b = tOf(e.clientX - r.left);
      const a = drag;
      drag = null;
      if (Math.abs(xOf(b) - xOf(a)) > 2) select(a, b);
    });
    weight.addEventListener('change', () => select(range[0], range[1]));
    select(0, tEnd);
    return { select, end: tEnd, chartBox: () => ({ L, W, T, H, B }) };
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
    if (data.flames.length || (data.memory_timelines || []).length) {
      const box = $('sg-memory');
      box.textContent = '';
      report.flames = data.flames.map((g, i) => renderFlame(box, g, i));
      report.memoryTimelines = (data.memory_timelines || []).map((m) => renderMemoryTimeline(box, m));
    }
    if ((data.cpu_flames || []).length) {
      const box = $('sg-cpu');
      box.textContent = '';
      report.cpuFlames = data.cpu_flames.map((g, i) => renderFlame(box, g, i));
    }
    const blob = await inflate($('sg-blob').textContent);
    if (blob.length !== data.timeline.blob_bytes) throw new Error('timeline data is damaged');
    if (data.timeline.hidden_tracks) {
      $('sg-notes').appendChild(el('li', {}, `timeline: ${data.timeline.hidden_tracks} more threads with ` +
        `${data.timeline.hidden_track_events} events in all are not shown (only the ${data.timeline.tracks.length} busiest)`));
    }
    const tlData = data.timeline;
    if (tlData.coarsened_lanes || tlData.coarsened_counters) {
      $('sg-notes').appendChild(el('li', { id: 'sg-coarsened' }, `timeline coarsened to keep this page small: ` +
        `${tlData.coarsened_events} events of ${tlData.coarsened_lanes} lanes` +
        (tlData.coarsened_counters ? ` and ${tlData.coarsened_counters} counters` : '') +
        ` are shown merged into spans (down to ${fmtNs(tlData.coarsened_ns)}), not one by one; search counts stay exact, ` +
        `details and range aggregates there are approximate`));
    }
    if (tlData.hidden_names) {
      $('sg-notes').appendChild(el('li', {}, `timeline: ${tlData.hidden_names} events have names past the page's budget, shown as one name`));
    }
    if (tlData.hidden_flows) {
      $('sg-notes').appendChild(el('li', {}, `timeline: ${tlData.hidden_flows} flows are not drawn (too many, or an end on a thread not shown)`));
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
    cpuSamples = await Promise.all((data.cpu_samples || []).map(async (s) => decodeCpuSamples(s, await inflate(s.encoded))));
    for (const s of cpuSamples) {
      if (s.hidden_samples) $('sg-notes').appendChild(el('li', {}, `${s.title}: the last ${s.hidden_samples} CPU samples are not in the range flame graphs`));
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
