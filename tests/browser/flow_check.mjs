// Async producer/consumer flows drawn as arrows, in Debian's chromium,
// headless, on a `spyglass report` page (a file) or a `spyglass view` page
// (its URL):
//   node flow_check.mjs PAGE --pair PTRACK/PNAME@PMS=CTRACK/CNAME@CMS... [--window A_MS,B_MS]
// Fails (exit 1) unless, with the timeline showing A..B ms (default: the
// whole run; a view page then fetches that window from its server), exactly
// one arrow is drawn for each --pair and no other from or to their threads
// (a consumer of another type has none), each from where PNAME
// starts at PMS ms in lane 0 of PTRACK to where CNAME starts at CMS ms in
// lane 0 of CTRACK; and a real mouse click at each end of each arrow selects
// that event (the details panel names it, at that start on that thread).
// No request may leave the page (its file, or its server) and no script
// may fail.
import { chromium } from 'playwright-core';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const argv = process.argv.slice(2);
const target = argv.shift();
const pairs = [];
let win = null;
const end = (v, flag) => {
  const m = /^(.*)\/(.*)@([0-9.]+)$/.exec(v || '');
  if (!m) { console.error(`${flag}: TRACK/NAME@MS`); process.exit(2); }
  return { track: m[1], name: m[2], ms: Number(m[3]) };
};
while (argv.length) {
  const a = argv.shift();
  if (a === '--pair') {
    const [p, c] = (argv.shift() || '').split('=');
    pairs.push({ from: end(p, a), to: end(c, a) });
  } else if (a === '--window') win = argv.shift().split(',').map(Number);
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
const url = /^https?:/.test(target) ? target : pathToFileURL(path.resolve(target)).href;
const problems = [];
const check = (ok, what) => { if (!ok) problems.push(what); };
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
const outside = [];
await page.route('**/*', (route) => {
  const u = route.request().url();
  const own = url.startsWith('file:') ? u === url : new URL(u).origin === new URL(url).origin;
  if (own) return route.continue();
  outside.push(u);
  return route.abort();
});
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));
await page.goto(url);
// (A view page may first show the index's progress, then load the timeline;
// polled from here: the pages' policy allows no eval, which waitForFunction's polling needs.)
for (const until = Date.now() + 60000; ;) {
  const state = await page.evaluate(() => document.body && (document.body.dataset.ready || document.body.dataset.error)).catch(() => null);
  if (state) break;
  if (Date.now() > until) { console.error('FAIL: not ready in 60 s'); process.exit(1); }
  await new Promise((r) => setTimeout(r, 20));
}
const T = (fn, arg) => page.evaluate(fn, arg);
check(!(await T(() => window.spyglassReport.error)), 'page error');
const served = await T(() => !!window.spyglassReport.view);
// Shows the window; a view page asks its server for it, and draws it when it comes.
const show = async (a, b) => {
  const before = served ? await T(() => window.spyglassReport.view.fetches) : 0;
  await T(([a, b]) => { window.spyglassReport.timeline.setView(a, b); window.spyglassReport.timeline.draw(); }, [a, b]);
  if (!served) return;
  const until = Date.now() + 20000;
  for (;;) {
    const v = await T(() => ({ fetches: window.spyglassReport.view.fetches, pending: window.spyglassReport.view.pending, error: window.spyglassReport.view.error }));
    if ((v.fetches > before && !v.pending) || v.error || Date.now() > until) {
      check(!v.error, `window error: ${v.error}`);
      check(v.fetches > before, 'no window asked of the server');
      break;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  await T(() => window.spyglassReport.timeline.draw());
};
const [a, b] = win ? [win[0] * 1e6, win[1] * 1e6] : [0, await T(() => window.spyglassReport.data.timeline.duration_ns)];
// Every thread of the pairs in view (the canvas shows some of its lanes at a time).
for (const p of pairs) for (const e of [p.from, p.to]) await T((t) => window.spyglassReport.timeline.reveal(t), e.track);
await page.locator('#tl-canvas').scrollIntoViewIfNeeded();
await show(a, b);
const geo = await T(([tracks]) => {
  const r = window.spyglassReport, c = document.getElementById('tl-canvas');
  const [a, b] = r.timeline.view();
  return { a, b, gutter: r.timeline.gutter, width: c.clientWidth,
    bands: Object.fromEntries(tracks.map((t) => [t, r.timeline.laneBand(t, 0)])),
    arrows: r.timeline.stats.flowArrows || [], drawn: r.timeline.stats.flowsDrawn };
}, [[...new Set(pairs.flatMap((p) => [p.from.track, p.to.track]))]]);
const xOf = (ms) => geo.gutter + ((ms * 1e6 - geo.a) * (geo.width - geo.gutter)) / (geo.b - geo.a);
const inBand = (y, t) => geo.bands[t] && y >= geo.bands[t][0] && y <= geo.bands[t][0] + geo.bands[t][1];
// Arrows that start or end on the pairs' threads (others, launch to kernel, are not theirs).
const theirs = geo.arrows.filter(([, y1, , y2]) => Object.keys(geo.bands).some((t) => inBand(y1, t) || inBand(y2, t)));
check(theirs.length === pairs.length, `${theirs.length} arrows on these threads (${JSON.stringify(theirs.map((r) => r.map(Math.round)))}), expected ${pairs.length}`);
const cbox = await page.locator('#tl-canvas').boundingBox();
// A click just inside the event that starts at the arrow's end: the panel names it.
const selectedAt = async (x, y) => {
  await page.mouse.click(cbox.x + x + 2, cbox.y + y);
  await page.waitForTimeout(30);
  const sel = await T(() => window.spyglassReport.timeline.selected());
  const name = await page.locator('#tl-details [data-field="name"]').first().innerText().catch(() => null);
  return { track: sel && sel.track, start: sel && sel.start, name };
};
for (const p of pairs) {
  const want = `${p.from.track}/${p.from.name}@${p.from.ms} -> ${p.to.track}/${p.to.name}@${p.to.ms}`;
  check(geo.bands[p.from.track] && geo.bands[p.to.track], `${want}: a thread not on the canvas`);
  const arrow = geo.arrows.find(([x1, y1, x2, y2]) => Math.abs(x1 - xOf(p.from.ms)) <= 1.5 && Math.abs(x2 - xOf(p.to.ms)) <= 1.5 &&
    inBand(y1, p.from.track) && inBand(y2, p.to.track));
  check(arrow, `${want}: no arrow from there to there (drawn: ${JSON.stringify(geo.arrows.map((r) => r.map(Math.round)))})`);
  if (!arrow) continue;
  for (const [e, x, y] of [[p.from, arrow[0], arrow[1]], [p.to, arrow[2], arrow[3]]]) {
    const got = await selectedAt(x, y);
    check(got.track === e.track && got.start === Math.round(e.ms * 1e6) && got.name === e.name,
      `${want}: the arrow's end at ${e.track}@${e.ms} ms selects ${JSON.stringify(got)}`);
  }
}
console.log(`${served ? 'view' : 'report'} page: ${theirs.length} arrows drawn for ${pairs.length} async pairs, ends checked by click`);
check(outside.length === 0, `requests outside the page: ${outside.join(', ')}`);
check(errors.length === 0, `script errors: ${errors.join('; ')}`);
await browser.close();
if (problems.length) { for (const p of problems) console.error('FAIL: ' + p); process.exit(1); }
console.log('flow_check: passed');
