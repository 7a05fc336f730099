// A `spyglass report` page in Debian's chromium, driven headless, with the
// network blocked:
//   node report_check.mjs REPORT.html [--steps N] [--step-ms A,B,...]
//        [--track NAME]... [--counter NAME]... [--counter-at NAME@MS=TEXT]...
//        [--tip-at TRACK/LANE@MS=TEXT]...
//        [--flame FUNCTION] [--no-flame] [--cpu-flame F1,F2] [--cpu-range A_MS:B_MS]... [--timing]
//        [--order TRACK,TRACK,...] [--search TEXT=COUNT]...
//        [--click TRACK/LANE@MS=NAME|DURATION|SELF]... [--enclosing TRACK/LANE@MS=NAME,NAME...]...
//        [--flow TRACK/LANE@MS=TRACK2/NAME2@MS2]... [--range-vs-summary SUMMARY.json]
//        [--thread-controls TRACK] [--step-jump N] [--shared-scale UNIT]
//        [--summary-jump NAME=COUNT] [--coarsened] [--python-flame] [--memory-range A_MS:B_MS=SITE|START|END|ALLOCATED|HIGHEST]...
// Fails (exit 1) unless the page loads with no request but its own file and
// no script error, and shows what is asked: N steps with exactly these
// durations (in the chart and the table), a drawn timeline with these
// tracks, counter tracks drawn (a step line in their band of the canvas)
// whose tooltip at MS ms from the start reads TEXT when the mouse is there,
// and a flame graph whose largest allocation site is FUNCTION, shown as the
// widest frame of its row. --tip-at: the tooltip of the span under the
// mouse at MS ms in lane LANE (0: outermost) of TRACK ends with the line
// TEXT (the event's details). --timing prints how long the page took.
// Interaction, with real mouse clicks where a user clicks:
// --order: the timeline's thread headings come in this order (others may
// follow); --search: the count of events whose name holds TEXT, and next
// selects one of them, in the details panel; --click: the details panel of
// the event under the mouse at MS ms in LANE of TRACK shows that name,
// duration and self time; --enclosing: its enclosing events, innermost
// first; --flow: its flow partner is NAME2 on TRACK2 at MS2 ms, and the
// panel's link selects it (and its own flow leads back); --range-vs-summary:
// a range dragged over the step that `spyglass summary --step N --json -n 0`
// wrote (its only step) is aggregated by name, each row's count, total and
// self time equal to the summary's (annotations and kernels); --thread-controls:
// pin, collapse and hide TRACK with its heading's icons (and show it again);
// --step-jump: clicking bar N of the step chart shows that step on the
// timeline; --shared-scale: counters of UNIT share one scale. The time
// axis never shows a trailing zero (500 ms, not 500.000 ms).
// --summary-jump: clicking NAME's row of the top annotations selects its
// first event on the timeline ("1 of COUNT");
// --coarsened: the page says it coarsened its timeline (and the range
// aggregate says it is approximate);
// --python-flame: the flame graph of make_known_run --python's profile, in
// each view (folded or not, inverted, sandwich, search, tooltip) through
// the page's controls; --memory-range: a range dragged on the memory-over-
// time chart lists SITE with these bytes; --cpu-range: a range shift+dragged
// over A..B ms of the first CPU samples track shows the flame graph of the
// CPU samples that start in it, whose self time by function is the time of
// the sample spans of that name in the range aggregate (the timeline's own
// copy of the samples), and the whole run's equals the CPU profile's.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const argv = process.argv.slice(2);
const file = argv.shift();
const opt = { tracks: [], counters: [], counterAt: [], tipAt: [], search: [], click: [], enclosing: [], flow: [] };
const laneAt = (v, flag) => {
  const m = /^(.*)\/([0-9]+)@([0-9.]+)=(.*)$/.exec(v || '');
  if (!m) { console.error(`${flag} TRACK/LANE@MS=...`); process.exit(2); }
  return { track: m[1], lane: Number(m[2]), ms: Number(m[3]), text: m[4] };
};
while (argv.length) {
  const a = argv.shift();
  if (a === '--steps') opt.steps = Number(argv.shift());
  else if (a === '--step-ms') opt.stepMs = argv.shift().split(',').map(Number);
  else if (a === '--track') opt.tracks.push(argv.shift());
  else if (a === '--counter') opt.counters.push(argv.shift());
  else if (a === '--counter-at') {
    const m = /^(.*)@([0-9.]+)=(.*)$/.exec(argv.shift() || '');
    if (!m) { console.error('--counter-at NAME@MS=TEXT'); process.exit(2); }
    opt.counterAt.push({ name: m[1], ms: Number(m[2]), text: m[3] });
  } else if (a === '--tip-at') {
    const m = /^(.*)\/([0-9]+)@([0-9.]+)=(.*)$/.exec(argv.shift() || '');
    if (!m) { console.error('--tip-at TRACK/LANE@MS=TEXT'); process.exit(2); }
    opt.tipAt.push({ track: m[1], lane: Number(m[2]), ms: Number(m[3]), text: m[4] });
  }
  else if (a === '--order') opt.order = argv.shift().split(',');
  else if (a === '--search') { const m = /^(.*)=([0-9]+)$/.exec(argv.shift() || ''); opt.search.push({ text: m[1], count: Number(m[2]) }); }
  else if (a === '--click') opt.click.push(laneAt(argv.shift(), a));
  else if (a === '--enclosing') opt.enclosing.push(laneAt(argv.shift(), a));
  else if (a === '--flow') opt.flow.push(laneAt(argv.shift(), a));
  else if (a === '--range-vs-summary') opt.rangeVsSummary = argv.shift();
  else if (a === '--thread-controls') opt.threadControls = argv.shift();
  else if (a === '--step-jump') opt.stepJump = Number(argv.shift());
  else if (a === '--shared-scale') opt.sharedScale = argv.shift();
  else if (a === '--python-flame') opt.pythonFlame = true;
  else if (a === '--coarsened') opt.coarsened = true;
  else if (a === '--summary-jump') { const m = /^(.*)=([0-9]+)$/.exec(argv.shift() || ''); (opt.summaryJump = opt.summaryJump || []).push({ name: m[1], count: Number(m[2]) }); }
  else if (a === '--memory-range') { const m = /^([0-9.]+):([0-9.]+)=(.*)$/.exec(argv.shift() || ''); (opt.memRange = opt.memRange || []).push({ a: Number(m[1]), b: Number(m[2]), want: m[3].split('|') }); }
  else if (a === '--flame') opt.flame = argv.shift();
  else if (a === '--no-flame') opt.noFlame = true;
  else if (a === '--cpu-flame') opt.cpuFlame = argv.shift().split(',');
  else if (a === '--cpu-range') { const m = /^([0-9.]+):([0-9.]+)$/.exec(argv.shift() || ''); (opt.cpuRange = opt.cpuRange || []).push({ a: Number(m[1]) * 1e6, b: Number(m[2]) * 1e6 }); }
  else if (a === '--timing') opt.timing = true;
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
if (!file) { console.error('usage: node report_check.mjs REPORT.html [options]'); process.exit(2); }
const url = pathToFileURL(path.resolve(file)).href;
const problems = [];
const check = (ok, what) => { if (!ok) problems.push(what); };

// Polls from outside: the page's CSP forbids the eval that the polling of
// page.waitForFunction needs.
async function waitReady(p, timeoutMs) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const state = await p.evaluate(() => document.body && (document.body.dataset.ready || document.body.dataset.error)).catch(() => null);
    if (state) return;
    if (Date.now() > end) throw new Error(`the page was not ready within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
let timing;
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, offline: true });
  const requests = [];
  // Every request is recorded and refused, except the page itself.
  await context.route('**/*', (route) => {
    const u = route.request().url();
    if (u === url) return route.continue();
    requests.push(u);
    return route.abort();
  });
  const page = await context.newPage();
  page.on('request', (r) => { if (r.url() !== url && !requests.includes(r.url())) requests.push(r.url()); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  const t0 = Date.now();
  await page.goto(url);
  await waitReady(page, 60000);
  const wall = Date.now() - t0;
  const state = await page.evaluate(() => ({ error: document.body.dataset.error, readyMs: window.spyglassReport.readyMs }));
  check(!state.error, `the page says: ${state.error}`);
  timing = { wall_ms: wall, ready_ms: Math.round(state.readyMs) };

  // Steps: the count, and each duration in the chart and the table.
  if (opt.steps !== undefined) {
    const count = await page.locator('#sg-step-count').textContent().catch(() => '');
    check(count === `${opt.steps} steps`, `step count: '${count}', expected '${opt.steps} steps'`);
    const bars = await page.locator('#sg-step-chart rect.bar').evaluateAll((rs) => rs.map((r) => [Number(r.dataset.step), Number(r.dataset.ns), r.textContent]));
    check(bars.length === opt.steps, `${bars.length} bars in the step chart, expected ${opt.steps}`);
    const stepTicks = await page.locator('#sg-step-chart text.sg-step-tick').allTextContents();
    for (const t of stepTicks) check(/^-?\d+(\.\d*[1-9])? (s|ms|µs|ns)$/.test(t), `step chart label '${t}' has spurious digits`);
    if (opt.stepMs) {
      opt.stepMs.forEach((ms, i) => {
        const bar = bars[i] || [];
        check(bar[1] === ms * 1e6, `step bar ${i}: ${bar[1]} ns, expected ${ms * 1e6}`);
        check(bar[2] === `step ${bar[0]}: ${ms} ms`, `step bar ${i} title '${bar[2]}'`);
      });
      await page.locator('#sg-steps details summary').click();
      const rows = await page.locator('#sg-steps table.steps-table tr').evaluateAll((trs) => trs.slice(1).map((tr) => tr.innerText.split('\t')));
      check(rows.length === opt.stepMs.length, `${rows.length} rows in the step table`);
      opt.stepMs.forEach((ms, i) => check(rows[i] && rows[i][1] === `${ms} ms`, `step row ${i}: ${rows[i]}`));
      check(await page.locator('#sg-steps details').isVisible(), 'step table not visible');
    }
  }

  // The timeline: tracks named, spans drawn (pixels on the canvas), fewer
  // spans drawn than events when there are many, and events when zoomed in.
  const tl = await page.evaluate(() => {
    const r = window.spyglassReport, c = document.getElementById('tl-canvas');
    if (!r.timeline) return null;
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let colored = 0;
    for (let i = 0; i < px.length; i += 4) if (px[i + 3] && Math.abs(px[i] - px[i + 1]) + Math.abs(px[i + 1] - px[i + 2]) > 30) colored++;
    const whole = { ...r.timeline.stats };
    const tracks = r.data.timeline.tracks.map((t) => t.name);
    const events = r.data.timeline.events, total = r.data.timeline.duration_ns;
    // Zoomed into the first thousandth: the finest level there.
    const zoomed = r.timeline.setView(0, total / 1000);
    r.timeline.setView(0, total);
    return { colored, whole, zoomed, tracks, events, total };
  });
  check(tl !== null, 'no timeline');
  if (tl) {
    check(tl.colored > 500, `the timeline canvas is blank (${tl.colored} coloured pixels)`);
    // (A run of counters alone, e.g. a memory-only trace, has no span.)
    check(tl.whole.drawn > 0 || (tl.events === 0 && opt.counters.length > 0), 'no span drawn');
    check(tl.whole.drawn <= tl.events, `${tl.whole.drawn} spans drawn for ${tl.events} events`);
    if (tl.events > 100000) check(tl.whole.drawn < tl.events / 10 && (tl.whole.maxLevel > 0 || opt.coarsened),
      `all at once: ${tl.whole.drawn} spans drawn of ${tl.events} events (level ${tl.whole.maxLevel})`);
    check(tl.zoomed.drawn + tl.zoomed.countersDrawn > 0, 'nothing drawn when zoomed in');
    for (const t of opt.tracks) check(tl.tracks.includes(t), `no timeline track '${t}' (${tl.tracks.join(', ')})`);
    // Counters: drawn in their own band, and the tooltip reads the value.
    for (const name of new Set([...opt.counters, ...opt.counterAt.map((c) => c.name)])) {
      const band = await page.evaluate((n) => {
        const r = window.spyglassReport, c = document.getElementById('tl-canvas');
        r.timeline.setView(0, r.data.timeline.duration_ns);
        const at = r.timeline.counterBand && r.timeline.counterBand(n);
        if (!at) return null;
        const dpr = window.devicePixelRatio || 1;
        const px = c.getContext('2d').getImageData(0, Math.round(at[0] * dpr), c.width, Math.round(at[1] * dpr)).data;
        let colored = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i + 3] && Math.abs(px[i] - px[i + 1]) + Math.abs(px[i + 1] - px[i + 2]) > 30) colored++;
        return { at, colored, drawn: r.timeline.stats.countersDrawn };
      }, name);
      check(band !== null, `no counter track '${name}'`);
      if (band) check(band.colored > 200 && band.drawn > 0, `counter '${name}' not drawn (${band.colored} coloured pixels in its band)`);
    }
    // The tooltip where the mouse is: at `ms` in the band `band(timeline)` gives.
    const tipAt = async (ms, band) => {
      await page.locator('#tl-canvas').scrollIntoViewIfNeeded();
      const where = await page.evaluate(([ms, band]) => {
        const r = window.spyglassReport, canvas = document.getElementById('tl-canvas');
        const [a, b] = r.timeline.view();
        const at = band[0] === 'counter' ? r.timeline.counterBand(band[1]) : r.timeline.laneBand && r.timeline.laneBand(band[1], band[2]);
        if (!at) return null;
        const x = r.timeline.gutter + ((ms * 1e6 - a) * (canvas.clientWidth - r.timeline.gutter)) / (b - a);
        return { x, y: at[0] + at[1] / 2 };
      }, [ms, band]);
      if (!where) return null;
      const cbox = await page.locator('#tl-canvas').boundingBox();
      await page.mouse.move(cbox.x + where.x, cbox.y + where.y);
      await page.waitForTimeout(50);
      return page.locator('#tl-tip').evaluate((t) => (t.hidden ? '' : t.textContent));
    };
    for (const c of opt.counterAt) {
      const tipText = await tipAt(c.ms, ['counter', c.name]);
      if (tipText === null) continue;  // no such counter: said above
      check(tipText.split('\n')[0] === c.text, `counter tooltip at ${c.ms} ms: '${tipText}', expected '${c.text}'`);
    }
    for (const c of opt.tipAt) {
      const tipText = await tipAt(c.ms, ['lane', c.track, c.lane]);
      check(tipText !== null, `no lane ${c.lane} in track '${c.track}'`);
      if (tipText !== null) check(tipText.split('\n').pop() === c.text, `tooltip at ${c.ms} ms in ${c.track}/${c.lane}: '${tipText}', expected its last line '${c.text}'`);
    }


    // ---- interaction ----------------------------------------------------------------
    const T = (fn, arg) => page.evaluate(fn, arg);
    const ticks = await T(() => { const r = window.spyglassReport; r.timeline.setView(0, r.data.timeline.duration_ns); return r.timeline.stats.ticks; });
    check(ticks.length >= 3, `${ticks.length} axis labels`);
    for (const t of ticks) check(/^-?\d+(\.\d*[1-9])? (s|ms|µs|ns)$/.test(t), `axis label '${t}' has spurious digits`);
    check(new Set(ticks).size === ticks.length, `axis labels repeat: ${ticks.join(', ')}`);
    if (opt.order) {
      const heads = await T(() => window.spyglassReport.timeline.rows().filter((r) => r.kind === 'head').map((r) => r.name));
      check(JSON.stringify(heads.slice(0, opt.order.length)) === JSON.stringify(opt.order), `thread order ${heads.join(', ')}, expected ${opt.order.join(', ')} first`);
      // Planes: host first, each plane's threads together.
      const groups = await T(() => window.spyglassReport.timeline.rows().filter((r) => r.kind === 'group').map((r) => r.name));
      check(groups.length > 0 && groups[0].startsWith('/host'), `plane headings: ${groups.join(' | ')}`);
    }
    // The canvas follows the lanes: as tall as they are, up to most of the window.
    const hh = await T(() => ({ h: window.spyglassReport.timeline.height(), c: window.spyglassReport.timeline.canvasHeight(), w: window.innerHeight }));
    check(Math.abs(hh.c - Math.min(hh.h, Math.round(hh.w * 0.7))) <= 2, `canvas ${hh.c} px for lanes of ${hh.h} px`);
    const panelField = (f) => page.locator(`#tl-details [data-field="${f}"]`).first().innerText().catch(() => null);
    // Puts TRACK's lane in view and returns the page coordinates of MS ms in it.
    const pointAt = async (track, lane, ms) => {
      await page.locator('#tl-canvas').scrollIntoViewIfNeeded();
      const where = await T(([track, lane, ms]) => {
        const r = window.spyglassReport, c = document.getElementById('tl-canvas');
        r.timeline.reveal(track);
        r.timeline.draw();
        const at = r.timeline.laneBand(track, lane);
        if (!at) return null;
        const [a, b] = r.timeline.view();
        return { x: r.timeline.gutter + ((ms * 1e6 - a) * (c.clientWidth - r.timeline.gutter)) / (b - a), y: at[0] + at[1] / 2 };
      }, [track, lane, ms]);
      if (!where) return null;
      const cbox = await page.locator('#tl-canvas').boundingBox();
      return { x: cbox.x + where.x, y: cbox.y + where.y };
    };
    const clickAt = async (track, lane, ms) => {
      const p = await pointAt(track, lane, ms);
      if (!p) return false;
      await page.mouse.click(p.x, p.y);
      await page.waitForTimeout(30);
      return true;
    };
    for (const c of opt.click) {
      await T(() => { const r = window.spyglassReport; r.timeline.setView(0, r.data.timeline.duration_ns); });
      check(await clickAt(c.track, c.lane, c.ms), `no lane ${c.lane} of '${c.track}'`);
      const [name, dur, self] = c.text.split('|');
      const got = { name: await panelField('name'), dur: await panelField('duration'), self: await panelField('self') };
      check(got.name === name && got.dur === dur && got.self === self,
        `click at ${c.ms} ms in ${c.track}/${c.lane}: panel ${JSON.stringify(got)}, expected ${name}, ${dur}, self ${self}`);
      const args = await panelField('args');
      check(args !== null && args.length > 0, 'the panel shows no arguments field');
    }
    for (const c of opt.enclosing) {
      await T(() => { const r = window.spyglassReport; r.timeline.setView(0, r.data.timeline.duration_ns); });
      await clickAt(c.track, c.lane, c.ms);
      const up = await page.locator('#tl-details [data-field="enclosing"] > div').evaluateAll((ds) => ds.map((d) => d.dataset.name));
      check(up.join(',') === c.text, `enclosing events of ${c.track}/${c.lane}@${c.ms}: ${up.join(',')}, expected ${c.text}`);
    }
    for (const c of opt.flow) {
      const m = /^(.*)\/(.*)@([0-9.]+)$/.exec(c.text);
      await T(() => { const r = window.spyglassReport; r.timeline.setView(0, r.data.timeline.duration_ns); });
      await clickAt(c.track, c.lane, c.ms);
      const p = await page.locator('#tl-details [data-field="flows"] > div').evaluateAll((ds) => ds.map((d) => ({ ...d.dataset })));
      check(p.length === 1 && p[0].track === m[1] && p[0].name === m[2] && Number(p[0].ns) === Math.round(Number(m[3]) * 1e6),
        `flow of ${c.track}/${c.lane}@${c.ms}: ${JSON.stringify(p)}, expected ${c.text}`);
      const drawn = await T(() => window.spyglassReport.timeline.stats.flowsDrawn);
      check(drawn > 0, 'no flow drawn');
      if (p.length === 1) {
        await page.locator('#tl-details [data-field="flows"] a').first().click();
        await page.waitForTimeout(30);
        const sel = await T(() => window.spyglassReport.timeline.selected());
        check(sel && sel.track === m[1] && sel.start === Math.round(Number(m[3]) * 1e6), `the flow link selected ${JSON.stringify(sel)}`);
        const back = await page.locator('#tl-details [data-field="flows"] > div').evaluateAll((ds) => ds.map((d) => ({ ...d.dataset })));
        check(back.length === 1 && back[0].track === c.track, `the partner's flow leads to ${JSON.stringify(back)}, not back to ${c.track}`);
      }
    }
    for (const sq of opt.search) {
      await page.locator('#tl-search').fill(sq.text);
      const count = await page.locator('#tl-count').innerText();
      check(count === `${sq.count} match${sq.count === 1 ? '' : 'es'}`, `search '${sq.text}': '${count}', expected ${sq.count}`);
      const names = [];
      // (A coarsened page lists fewer events than it counts: next and previous walk those.)
      if (opt.coarsened) { await page.locator('#tl-search').fill(''); continue; }
      for (let i = 0; i < Math.min(sq.count, 3); i++) {
        await page.locator('#tl-next').click();
        names.push(await panelField('name'));
      }
      const after = await page.locator('#tl-count').innerText();
      check(names.every((n) => n && n.toLowerCase().includes(sq.text.toLowerCase())), `search '${sq.text}' next selected ${names.join(', ')}`);
      check(sq.count === 0 || after.startsWith(`${Math.min(sq.count, 3)} of ${sq.count}`), `after next: '${after}'`);
      if (sq.count > 1) {
        await page.locator('#tl-prev').click();
        check((await page.locator('#tl-count').innerText()).startsWith(`${Math.min(sq.count, 3) - 1} of`), 'previous did not go back');
      }
      await page.locator('#tl-search').fill('');
    }
    if (opt.rangeVsSummary) {
      const sum = JSON.parse(fs.readFileSync(opt.rangeVsSummary, 'utf8'));
      const st = sum.steps.all[0];
      const tl0 = await T(() => window.spyglassReport.data.timeline.start_ns);
      const a = st.start_ns - tl0, b = a + st.duration_ns;
      // The mouse: shift+drag over (about) the step, then the exact window.
      await T(([a, b]) => window.spyglassReport.timeline.setView(a - (b - a) * 0.2, b + (b - a) * 0.2), [a, b]);
      const p1 = await pointAt('main', 0, a / 1e6), p2 = await pointAt('main', 0, b / 1e6);
      await page.keyboard.down('Shift');
      await page.mouse.move(p1.x, p1.y);
      await page.mouse.down();
      await page.mouse.move(p2.x, p2.y, { steps: 8 });
      await page.mouse.up();
      await page.keyboard.up('Shift');
      const kind = await page.locator('#tl-details').getAttribute('data-kind');
      const rowsUi = await page.locator('#tl-details table.range-agg tr').count();
      check(kind === 'range' && rowsUi > 1, `a shift+drag made no range aggregate (${kind}, ${rowsUi} rows)`);
      const agg = await T(([a, b]) => window.spyglassReport.timeline.selectRange(a, b), [a, b]);
      const byName = new Map(agg.rows.map((r) => [r.name, r]));
      const near = (x, y) => Math.abs(x - y) <= 1;
      for (const r of sum.top_total) {
        const g = byName.get(r.name);
        check(g && g.count === r.count && near(g.total_ns, r.total_ns) && near(g.self_ns, r.self_ns),
          `range ${a}-${b}: '${r.name}' ${JSON.stringify(g)}, summary count ${r.count} total ${r.total_ns} self ${r.self_ns}`);
      }
      for (const r of sum.kernels || []) {
        const g = byName.get(r.name);
        check(g && g.count === r.count && near(g.total_ns, r.total_ns), `range: kernel '${r.name}' ${JSON.stringify(g)}, summary ${r.count} ${r.total_ns}`);
      }
      check(sum.top_total.length > 0, 'the summary has no annotation in the window');
      const shown = await page.locator('#tl-details table.range-agg tr').evaluateAll((trs) => trs.slice(1).map((tr) => tr.children[0].textContent));
      check(shown.includes(sum.top_total[0].name), `the range table lacks ${sum.top_total[0].name}`);
    }
    for (const { a, b } of opt.cpuRange || []) {
      const track = await T(() => window.spyglassReport.data.timeline.tracks.map((t) => t.name).find((n) => n.endsWith(' CPU samples')));
      check(track, 'no CPU samples track on the timeline');
      if (!track) break;
      await T(([a, b]) => window.spyglassReport.timeline.setView(a - (b - a) * 0.2, b + (b - a) * 0.2), [a, b]);
      const p1 = await pointAt(track, 0, a / 1e6), p2 = await pointAt(track, 0, b / 1e6);
      await page.keyboard.down('Shift');
      await page.mouse.move(p1.x, p1.y);
      await page.mouse.down();
      await page.mouse.move(p2.x, p2.y, { steps: 8 });
      await page.mouse.up();
      await page.keyboard.up('Shift');
      const drawn = await page.locator('#tl-details .range-cpu .fl-node').evaluateAll((ds) => ds.map((d) => d.dataset.name));
      check(drawn.length > 1, `a shift+drag over ${a / 1e6}-${b / 1e6} ms drew no CPU flame graph (${drawn.length} frames)`);
      const inRange = ([a, b]) => {
        const r = window.spyglassReport.timeline.selectRange(a, b);
        return { rows: r.rows, cpu: (r.cpu || []).map((c) => ({ samples: c.samples, total: c.total_ns, nodes: c.flame ? c.flame.nodes() : [] })) };
      };
      const got = await T(inRange, [a, b]);
      const self = new Map();
      let samples = 0, total = 0;
      for (const c of got.cpu) {
        samples += c.samples; total += c.total;
        for (const n of c.nodes) if (n.depth > 0 && n.self > 0) self.set(n.name, (self.get(n.name) || 0) + n.self);
      }
      const spans = new Map(got.rows.map((r) => [r.name, r]));
      check(samples > 0 && samples === got.rows.reduce((s, r) => s + r.count, 0),
        `range ${a}-${b}: ${samples} CPU samples, ${got.rows.reduce((s, r) => s + r.count, 0)} sample spans start in it`);
      check([...self.keys()].sort().join() === [...spans.keys()].sort().join(),
        `range ${a}-${b}: innermost functions ${[...self.keys()].sort()} vs sample spans ${[...spans.keys()].sort()}`);
      for (const [name, r] of spans) {
        const want = r.count * r.mean_ns;
        check(Math.abs((self.get(name) || 0) - want) <= 1e-6 * want + 1, `range ${a}-${b}: ${name} self ${self.get(name)}, its sample spans ${want}`);
      }
      // The whole run: more samples, and the CPU profile's (pprof) total.
      const whole = await T(inRange, [0, await T(() => window.spyglassReport.data.timeline.duration_ns + 1)]);
      const wholeTotal = whole.cpu.reduce((s, c) => s + c.total, 0);
      check(wholeTotal > total, `range ${a}-${b}: ${total} ns of CPU, not less than the whole run's ${wholeTotal}`);
      const profile = Number(await page.locator('#sg-cpu .flame .fl-node[data-kind="root"]').first().getAttribute('data-value'));
      check(Math.abs(profile - wholeTotal) <= 1e-6 * profile, `the whole run's samples: ${wholeTotal} ns of CPU, the CPU profile ${profile}`);
    }
    if (opt.coarsened) {
      const note = await page.locator('#sg-coarsened').innerText().catch(() => '');
      check(/timeline coarsened to keep this page small: \d+ events of \d+ lanes/.test(note), `no note of the coarsening: '${note}'`);
      const agg = await T(() => { const r = window.spyglassReport; r.timeline.selectRange(0, r.data.timeline.duration_ns); return document.getElementById('tl-details').innerText; });
      check(agg.includes('approximate'), 'the range aggregate of a coarsened page does not say it is approximate');
    } else {
      check(await page.locator('#sg-coarsened').count() === 0, 'a page within its budget says it was coarsened');
    }
    if (opt.threadControls) {
      const name = opt.threadControls;
      const iconAt = async (i) => {
        await page.locator('#tl-canvas').scrollIntoViewIfNeeded();
        const hb = await T((n) => { window.spyglassReport.timeline.scrollTo(0); return window.spyglassReport.timeline.headBand(n); }, name);
        const cbox = await page.locator('#tl-canvas').boundingBox();
        await page.mouse.click(cbox.x + 8 + i * 15, cbox.y + hb[0] + hb[1] / 2);
        await page.waitForTimeout(30);
      };
      const rows = () => T(() => window.spyglassReport.timeline.rows());
      const before = await rows(), hBefore = await T(() => window.spyglassReport.timeline.height());
      await iconAt(1);  // pin: first under the "Pinned" heading
      let r = await rows();
      check(r[0].kind === 'group' && r[0].name.startsWith('Pinned') && r[1].kind === 'head' && r[1].name === name, `pinning ${name}: ${r.slice(0, 2).map((x) => x.name).join(', ')}`);
      await iconAt(1);  // unpin
      await iconAt(0);  // collapse: no lane of it, a shorter canvas
      r = await rows();
      const lanes = r.filter((x) => x.kind === 'lane' && x.name === name).length;
      const hCollapsed = await T(() => window.spyglassReport.timeline.height());
      check(lanes === 0 && hCollapsed < hBefore, `collapsing ${name}: ${lanes} lanes, height ${hBefore} -> ${hCollapsed}`);
      await iconAt(0);  // expand
      await iconAt(2);  // hide
      r = await rows();
      check(!r.some((x) => x.name === name), `hiding ${name}: still shown`);
      check(await page.locator('#tl-hidden').isVisible(), 'no button to show the hidden threads');
      await page.locator('#tl-hidden').click();
      r = await rows();
      check(r.length === before.length, `${r.length} rows after showing the hidden thread again, ${before.length} before`);
    }
    if (opt.sharedScale) {
      const sc = await T(() => window.spyglassReport.timeline.scales());
      const all = await T(() => window.spyglassReport.data.timeline.counters.map((c) => ({ name: c.name, bytes: c.bytes, max: c.max })));
      const of = all.filter((c) => (opt.sharedScale === 'bytes' ? c.bytes : false));
      const tops = new Set(sc.filter((s) => of.some((c) => c.name === s.name)).map((s) => s.top));
      check(of.length > 1 && tops.size === 1 && [...tops][0] === Math.max(...of.map((c) => c.max)),
        `${of.length} ${opt.sharedScale} counters on scales ${[...tops].join(', ')}`);
    }
    for (const sj of opt.summaryJump || []) {
      const row = page.locator('#sg-summary table tr.jump', { has: page.locator(`td:text-is("${sj.name}")`) }).first();
      await row.click();
      await page.waitForTimeout(50);
      const count = await page.locator('#tl-count').innerText();
      const name = await panelField('name');
      check(count.startsWith(`1 of ${sj.count} match`) && name === sj.name,
        `clicking the summary row of ${sj.name}: '${count}', panel '${name}'`);
      const inView = await T(() => { const b = document.getElementById('timeline').getBoundingClientRect(); return b.top < window.innerHeight && b.bottom > 0; });
      check(inView, 'the timeline is not in view after a summary row click');
      await page.locator('#tl-search').fill('');
    }
    if (opt.stepJump !== undefined) {
      const st = await T(() => window.spyglassReport.data.summary.steps.all);
      const s = st[opt.stepJump];
      await page.locator('#sg-step-chart rect.bar').nth(opt.stepJump).click();
      await page.waitForTimeout(50);
      const v = await T(() => ({ view: window.spyglassReport.timeline.view(), start: window.spyglassReport.data.timeline.start_ns }));
      const a = s.start_ns - v.start, b = a + s.duration_ns;
      check(v.view[0] <= a && v.view[1] >= b && v.view[1] - v.view[0] <= (b - a) * 1.2 + 1, `step bar ${opt.stepJump} showed ${v.view}, step at ${a}-${b}`);
    }

    // The wheel zooms in where the mouse is; a drag pans.
    await page.locator('#tl-canvas').scrollIntoViewIfNeeded();
    const box = await page.locator('#tl-canvas').boundingBox();
    await page.mouse.move(box.x + box.width * 0.6, box.y + 40);
    await page.mouse.wheel(0, -800);
    await page.waitForTimeout(100);
    const zoomedIn = await page.evaluate(() => window.spyglassReport.timeline.view());
    check(zoomedIn[0] > 0 && zoomedIn[1] - zoomedIn[0] < tl.total / 2, `the wheel did not zoom in: view ${zoomedIn}`);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.3, box.y + 40, { steps: 5 });
    await page.mouse.up();
    await page.waitForTimeout(100);
    const panned = await page.evaluate(() => window.spyglassReport.timeline.view());
    check(panned[0] > zoomedIn[0], `dragging left did not move the view later: ${zoomedIn} -> ${panned}`);
    Object.assign(timing, { events: tl.events, drawn_whole: tl.whole.drawn, level_whole: tl.whole.maxLevel });
  }

  // The flame graph names the top allocator: the first site of its table
  // and the widest frame under the root.
  if (opt.flame) {
    const fl = await page.evaluate(() => [...document.querySelectorAll('.profile')].map((p) => ({
      site: (p.querySelector('table.sites tr:nth-child(2) td') || {}).textContent,
      nodes: [...p.querySelectorAll('.fl-node')].map((n) => ({ name: n.dataset.name, value: Number(n.dataset.value), top: n.style.top, visible: n.offsetWidth > 0 })),
    })));
    check(fl.length > 0, 'no memory profile shown');
    for (const p of fl) {
      check(p.site && p.site.startsWith(opt.flame), `top allocation site '${p.site}', expected ${opt.flame}`);
      const named = p.nodes.filter((n) => n.name === opt.flame && n.visible);
      check(named.length > 0, `no visible flame graph frame named ${opt.flame}`);
      // The widest frame of its row (its siblings and cousins).
      for (const n of named) {
        const widest = Math.max(...p.nodes.filter((m) => m.top === n.top).map((m) => m.value));
        check(n.value === widest, `${opt.flame} (${n.value}) is not the widest frame of its row (${widest})`);
      }
    }
    const label = await page.locator(`.fl-node[data-name="${opt.flame}"]`).first();
    await label.click();  // zooms to it
    const crumbs = await page.locator('.fl-crumbs').first().textContent();
    check(crumbs.includes(opt.flame), `clicking ${opt.flame} did not zoom to it: '${crumbs}'`);
  }

  if (opt.pythonFlame) {
    const prof = page.locator('.profile').first();
    await prof.scrollIntoViewIfNeeded();
    const nodes = () => page.evaluate(() => window.spyglassReport.flames[0].nodes());
    const sig = (ns) => ns.map((n) => `${'.'.repeat(n.depth)}${n.name}${n.loc ? '@' + n.loc : ''}:${n.kind}:${n.value}`).join(' ');
    // Folded (the default): the program's frames only, Python ones with file:line.
    let ns = await nodes();
    const folded = 'all:root:12288 .main@/usr/lib/python3.11/json/tool.py:67:python:12288 ..load_rows@/srv/app.py:12:python:8192 ' +
      '...PyList_Append:native:8192 ....malloc:native:8192 ..raw_decode@/usr/lib/python3.11/json/decoder.py:353:python:4096 ' +
      '...PyUnicode_New:native:4096 ....malloc:native:4096';
    check(sig(ns) === folded, `folded flame graph:\n    ${sig(ns)}\n  expected\n    ${folded}`);
    const foldText = await prof.locator('label').first().innerText();
    check(foldText.includes('(7 such frames)'), `fold label '${foldText}'`);
    // Drawn: the Python frames in the Python colours, each with its file:line.
    const drawn = await prof.locator('.flame .fl-node[data-kind="python"]').evaluateAll((ds) => ds.map((d) => d.dataset.loc));
    check(drawn.length === 3 && drawn.every((l) => /\.py:\d+$/.test(l)), `python frames drawn: ${drawn}`);
    await prof.locator('input.fl-fold').uncheck();
    ns = await nodes();
    check(ns.length === 15 && ns[1].name === '_start' && ns[1].kind === 'interpreter' && ns.filter((n) => n.kind === 'interpreter').length === 7,
      `unfolded: ${sig(ns)}`);
    await prof.locator('input.fl-fold').check();
    // Inverted: the allocating frame on top, its callers below.
    await prof.locator('select.fl-view').selectOption('inverted');
    ns = await nodes();
    check(ns[1] && ns[1].name === 'malloc' && ns[1].depth === 1 && ns[1].value === 12288 && ns[2].name === 'PyList_Append' && ns[2].value === 8192,
      `inverted: ${sig(ns)}`);
    // Sandwich: raw_decode's callers above, its callees below.
    await page.evaluate(() => window.spyglassReport.flames[0].sandwich('raw_decode'));
    const callers = sig(await nodes()), callees = sig(await page.evaluate(() => window.spyglassReport.flames[0].nodes(2)));
    check(callers === 'all:root:4096 .raw_decode@/usr/lib/python3.11/json/decoder.py:353:python:4096 ..main@/usr/lib/python3.11/json/tool.py:67:python:4096',
      `sandwich callers: ${callers}`);
    check(callees === 'all:root:4096 .raw_decode@/usr/lib/python3.11/json/decoder.py:353:python:4096 ..PyUnicode_New:native:4096 ...malloc:native:4096',
      `sandwich callees: ${callees}`);
    check(await prof.locator('.flame-callees').isVisible(), 'the callees are not shown');
    await prof.locator('select.fl-view').selectOption('flame');
    // Search: the share under matching frames, the matches outlined.
    await prof.locator('input.fl-search').fill('decoder');
    const found = await prof.locator('.fl-found').innerText();
    check(found.startsWith('4 KiB (33.3 %)'), `search 'decoder': '${found}'`);
    const hl = await prof.locator('.flame .fl-node.fl-match').evaluateAll((ds) => ds.map((d) => d.dataset.name));
    check(hl.join(',') === 'raw_decode', `matches outlined: ${hl}`);
    await prof.locator('input.fl-search').fill('');
    // The tooltip, at once.
    await prof.locator('.flame .fl-node[data-name="raw_decode"]').hover();
    const tipText = await page.locator('#fl-tip').evaluate((t) => (t.hidden ? '' : t.textContent));
    check(tipText.includes('/usr/lib/python3.11/json/decoder.py:353 · python') && tipText.includes('4 KiB'), `flame tooltip: '${tipText}'`);
  }
  for (const r of opt.memRange || []) {
    const chart = page.locator('canvas.memtl-chart').first();
    await chart.scrollIntoViewIfNeeded();
    const geo = await page.evaluate(() => { const m = window.spyglassReport.memoryTimelines[0]; return { end: m.end, ...m.chartBox() }; });
    const bb = await chart.boundingBox();
    const xOf = (ms) => bb.x + geo.L + ((geo.W - geo.L - 4) * ms * 1e6) / geo.end;
    await page.mouse.move(xOf(r.a), bb.y + 60);
    await page.mouse.down();
    await page.mouse.move(xOf(r.b), bb.y + 60, { steps: 6 });
    await page.mouse.up();
    const rows = await page.locator('.memtl table.memtl-sites tr').evaluateAll((trs) => trs.slice(1).map((tr) => [...tr.children].map((td) => td.textContent)));
    const row = rows.find((x) => x[0] === r.want[0]);
    const got = row ? [row[0], row[2], row[3], row[4], row[5]].join('|') : '(none)';
    check(got === r.want.join('|'), `memory range ${r.a}-${r.b} ms: ${got}, expected ${r.want.join('|')}`);
    const fl = await page.locator('.memtl .memtl-flame .fl-node').evaluateAll((ds) => ds.map((d) => `${d.dataset.name}:${d.dataset.value}`));
    check(fl.length > 1, `no flame graph of the range (${fl})`);
  }
  if (opt.noFlame) check(await page.locator('.profile').count() === 0, 'a memory profile is shown');
  if (opt.cpuFlame) {
    // The CPU section: these functions drawn; each thread's root total is
    // smaller than all threads', and they add up to it.
    const sec = page.locator('#sg-cpu .profile').first();
    check(await sec.count() === 1, 'no CPU flame graph');
    await sec.scrollIntoViewIfNeeded();
    const names = await page.locator('#sg-cpu .fl-node').evaluateAll((ds) => ds.map((d) => d.dataset.name));
    for (const f of opt.cpuFlame) check(names.includes(f), `CPU flame graph: no frame ${f} (${names.slice(0, 20)})`);
    const rootTotal = async () => Number(await page.locator('#sg-cpu .flame .fl-node[data-kind="root"]').first().getAttribute('data-value'));
    const all = await rootTotal();
    const threads = await page.locator('#sg-cpu select.fl-who option').evaluateAll((os) => os.map((o) => o.value).filter((v) => v[0] === 't'));
    check(threads.length >= 2, `CPU thread selector: ${threads.length} threads`);
    let sum = 0;
    for (const t of threads) {
      await page.locator('#sg-cpu select.fl-who').first().selectOption(t);
      const v = await rootTotal();
      check(v > 0 && v < all, `CPU thread ${t}: root ${v}, all threads ${all}`);
      sum += v;
    }
    check(sum === all, `CPU threads add up to ${sum}, all threads ${all}`);
    await page.locator('#sg-cpu select.fl-who').first().selectOption('all');
    check(await rootTotal() === all, 'CPU selector back to all threads');
  }
  check(requests.length === 0, `requests were attempted: ${requests.slice(0, 5).join(', ')}`);
  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
} finally {
  await browser.close();
}
if (problems.length) {
  console.error(`FAIL: ${file}:\n  ${problems.join('\n  ')}`);
  process.exit(1);
}
console.log(opt.timing ? JSON.stringify(timing) : `ok: ${file}`);
