// Times `spyglass report` pages in Debian's chromium (headless), next to
// their baselines; run by bench/report_bench.sh:
//   node bench/report_bench.mjs RUNS REPORT.html NAIVE.html FLOOR.html [PEER_TRACE.json.gz]
// For each page, the median over RUNS fresh pages of: ready (ms from
// navigation start until the page says it has drawn everything once), and
// for the timeline the slowest redraw of a zoom sweep from the whole run to a
// microsecond, a search by name (the count, then the first match) and the
// range aggregate of the whole run and of its middle tenth. The floor is the same bytes without the page's code (HTML
// parsing only: ms to the load event). The peer is speedscope's own web app
// opening a trace JSON (ms until it shows the profile, at most 5 minutes).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(path.join(root, 'tests', 'browser', 'package.json'));
const { chromium } = require('playwright-core');

const [runsArg, reportHtml, naiveHtml, floorHtml, traceGz] = process.argv.slice(2);
const runs = Number(runsArg) || 3;
const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox', '--allow-file-access-from-files'] });

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

async function page(file, fn) {
  const out = [];
  for (let i = 0; i < runs; i++) {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, offline: true });
    const p = await context.newPage();
    const t0 = Date.now();
    try {
      await p.goto(pathToFileURL(path.resolve(file)).href + (fn.hash || ''), { timeout: 300000, waitUntil: 'commit' });
      out.push(await fn(p, t0));
    } catch (e) {
      out.push({ error: `not shown within 5 minutes (${String(e.message).split('\n')[0]})` });
    }
    await context.close();
  }
  return out;
}

async function reportPage(p, t0) {
  await waitReady(p, 300000);
  const wall = Date.now() - t0;
  return p.evaluate((wall) => {
    const r = window.spyglassReport;
    if (!r.ready) return { error: document.body.dataset.error };
    const total = r.data.timeline.duration_ns;
    let worst = 0, drawnMax = 0, pointsMax = 0;
    for (let w = total; w >= 1000; w /= 4) {  // zoom sweep, centred
      const a = total / 2 - w / 2;
      const t = performance.now();
      const s = r.timeline.setView(a, a + w);
      worst = Math.max(worst, performance.now() - t);
      drawnMax = Math.max(drawnMax, s.drawn);
      pointsMax = Math.max(pointsMax, s.counterPoints || 0);
    }
    const samples = (r.data.timeline.counters || []).reduce((n, c) => n + c.samples, 0);
    // Search (the count, then the first match: the list of matches built)
    // and the range aggregate (the whole run, and its middle tenth).
    const names = r.data.timeline.names;
    const q = names.includes('forward') ? 'forward' : names[0] || '';
    let t = performance.now();
    const matches = r.timeline.search(q);
    const searchMs = performance.now() - t;
    t = performance.now();
    r.timeline.next();
    const firstMatchMs = performance.now() - t;
    r.timeline.search('');
    t = performance.now();
    const all = r.timeline.selectRange(0, total);
    const rangeAllMs = performance.now() - t;
    t = performance.now();
    r.timeline.selectRange(total * 0.45, total * 0.55);
    const rangeTenthMs = performance.now() - t;
    return { ready: r.readyMs, wall, worstRedraw: worst, drawnMax, pointsMax, samples, events: r.data.timeline.events,
             searchMs, firstMatchMs, matches, rangeAllMs, rangeTenthMs, rangeNames: all.rows.length,
             coarsened: r.data.timeline.coarsened_events };
  }, wall);
}

async function floorPage(p) {
  await p.waitForLoadState('load', { timeout: 300000 });
  return p.evaluate(() => ({ ready: performance.getEntriesByType('navigation')[0].loadEventEnd }));
}

const summarize = (name, xs) => {
  if (xs.some((x) => x.error)) { console.log(`${name}: ${xs.find((x) => x.error).error}`); return; }
  const r = { ready_ms: Math.round(median(xs.map((x) => x.ready))) };
  if (xs[0].wall !== undefined) r.wall_ms = median(xs.map((x) => x.wall));
  if (xs[0].worstRedraw !== undefined) {
    r.slowest_redraw_ms = Number(median(xs.map((x) => x.worstRedraw)).toFixed(1));
    r.most_spans_drawn = xs[0].drawnMax;
    r.events = xs[0].events;
    if (xs[0].samples) Object.assign(r, { most_counter_points_drawn: xs[0].pointsMax, counter_samples: xs[0].samples });
    const ms = (k) => Number(median(xs.map((x) => x[k])).toFixed(1));
    Object.assign(r, { search_ms: ms('searchMs'), first_match_ms: ms('firstMatchMs'), matches: xs[0].matches,
      range_all_ms: ms('rangeAllMs'), range_tenth_ms: ms('rangeTenthMs'), coarsened_events: xs[0].coarsened });
  }
  console.log(`${name}: ${JSON.stringify(r)}`);
};
summarize('report', await page(reportHtml, reportPage));
summarize('naive (every event drawn, no levels)', await page(naiveHtml, reportPage));
summarize('floor (the same bytes, no code)', await page(floorHtml, floorPage));

// The peer: speedscope's web app with the trace JSON of the same run.
if (traceGz) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'speedscope-bench-'));
  const loader = path.join(tmp, 'profile.js');
  const bytes = zlib.gunzipSync(fs.readFileSync(traceGz));
  fs.writeFileSync(loader, `speedscope.loadFileFromBase64("big.trace.json", ${JSON.stringify(bytes.toString('base64'))})`);
  const app = path.join(root, 'tests', 'browser', 'node_modules', 'speedscope', 'dist', 'release', 'index.html');
  const fn = async (p, t0) => {
    await p.getByText(/\(1\/\d+\)/).first().waitFor({ timeout: 300000 });
    return { ready: Date.now() - t0 };
  };
  fn.hash = `#localProfilePath=${loader}`;
  summarize(`peer: speedscope, ${path.basename(traceGz)} (wall)`, await page(app, fn));
  fs.rmSync(tmp, { recursive: true, force: true });
}
await browser.close();
