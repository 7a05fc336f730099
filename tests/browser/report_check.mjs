// A `spyglass report` page in Debian's chromium, driven headless, with the
// network blocked:
//   node report_check.mjs REPORT.html [--steps N] [--step-ms A,B,...]
//        [--track NAME]... [--counter NAME]... [--counter-at NAME@MS=TEXT]...
//        [--tip-at TRACK/LANE@MS=TEXT]...
//        [--flame FUNCTION] [--no-flame] [--timing]
// Fails (exit 1) unless the page loads with no request but its own file and
// no script error, and shows what is asked: N steps with exactly these
// durations (in the chart and the table), a drawn timeline with these
// tracks, counter tracks drawn (a step line in their band of the canvas)
// whose tooltip at MS ms from the start reads TEXT when the mouse is there,
// and a flame graph whose largest allocation site is FUNCTION, shown as the
// widest frame of its row. --tip-at: the tooltip of the span under the
// mouse at MS ms in lane LANE (0: outermost) of TRACK ends with the line
// TEXT (the event's details). --timing prints how long the page took.
import { chromium } from 'playwright-core';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const argv = process.argv.slice(2);
const file = argv.shift();
const opt = { tracks: [], counters: [], counterAt: [], tipAt: [] };
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
  else if (a === '--flame') opt.flame = argv.shift();
  else if (a === '--no-flame') opt.noFlame = true;
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
    if (opt.stepMs) {
      opt.stepMs.forEach((ms, i) => {
        const bar = bars[i] || [];
        check(bar[1] === ms * 1e6, `step bar ${i}: ${bar[1]} ns, expected ${ms * 1e6}`);
        check(bar[2] === `step ${bar[0]}: ${ms.toFixed(3)} ms`, `step bar ${i} title '${bar[2]}'`);
      });
      await page.locator('#sg-steps details summary').click();
      const rows = await page.locator('#sg-steps table.steps-table tr').evaluateAll((trs) => trs.slice(1).map((tr) => tr.innerText.split('\t')));
      check(rows.length === opt.stepMs.length, `${rows.length} rows in the step table`);
      opt.stepMs.forEach((ms, i) => check(rows[i] && rows[i][1] === `${ms.toFixed(3)} ms`, `step row ${i}: ${rows[i]}`));
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
    if (tl.events > 100000) check(tl.whole.drawn < tl.events / 10 && tl.whole.maxLevel > 0,
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
  if (opt.noFlame) check(await page.locator('.profile').count() === 0, 'a memory profile is shown');
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
