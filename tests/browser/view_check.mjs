// A page served by `spyglass view` in Debian's chromium, headless:
//   node view_check.mjs URL [--track NAME]... [--zoom-ms A,B --expect-name NAME] [--same-panels-as REPORT.html]
// Fails (exit 1) unless the page loads with no request outside the server
// and no script error, draws the named tracks, and, zoomed to [A, B] ms,
// asks the server for that window and draws single events (level 0) there,
// the first of them (under the mouse in lane 0 of the first --track) named NAME. Prints the page's ready time.
// --same-panels-as: the step chart, summary, CPU and memory sections (flame
// graphs, memory timelines) read as those of `spyglass report`'s page of the
// same run, and are not empty.
import { chromium } from 'playwright-core';

const argv = process.argv.slice(2);
const url = argv.shift();
const opt = { tracks: [] };
while (argv.length) {
  const a = argv.shift();
  if (a === '--track') opt.tracks.push(argv.shift());
  else if (a === '--zoom-ms') opt.zoom = argv.shift().split(',').map(Number);
  else if (a === '--expect-name') opt.name = argv.shift();
  else if (a === '--same-panels-as') opt.report = argv.shift();
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
const origin = new URL(url).origin;
const problems = [];
const check = (ok, what) => { if (!ok) problems.push(what); };
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
const page = await browser.newPage();
const outside = [];
await page.route('**/*', (route) => {
  const u = route.request().url();
  if (new URL(u).origin === origin) return route.continue();
  outside.push(u);
  return route.abort();
});
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));
await page.goto(url);
const end = Date.now() + 60000;
for (;;) {
  const state = await page.evaluate(() => document.body && (document.body.dataset.ready || document.body.dataset.error)).catch(() => null);
  if (state) break;
  if (Date.now() > end) { console.error('FAIL: not ready in 60 s'); process.exit(1); }
  await new Promise((r) => setTimeout(r, 20));
}
const first = await page.evaluate(() => ({ ready: window.spyglassReport.readyMs, error: window.spyglassReport.error,
  tracks: window.spyglassReport.data.timeline.tracks.map((t) => t.name), drawn: Number(document.getElementById('tl-canvas').dataset.drawn) }));
check(!first.error, `page error: ${first.error}`);
for (const t of opt.tracks) check(first.tracks.includes(t), `no track ${t} (have ${first.tracks.join(', ')})`);
check(first.drawn > 0, 'nothing drawn at first');
console.log(`page ready after ${first.ready.toFixed(0)} ms, ${first.drawn} spans drawn`);
if (opt.zoom) {
  const [a, b] = opt.zoom;
  const before = await page.evaluate(() => window.spyglassReport.view.fetches);
  await page.evaluate(([a, b]) => window.spyglassReport.timeline.setView(a * 1e6, b * 1e6), [a, b]);
  const until = Date.now() + 20000;
  let got = null;
  for (;;) {
    got = await page.evaluate(() => ({ fetches: window.spyglassReport.view.fetches, pending: window.spyglassReport.view.pending,
      error: window.spyglassReport.view.error, level: Number(document.getElementById('tl-canvas').dataset.level),
      drawn: Number(document.getElementById('tl-canvas').dataset.drawn) }));
    if ((got.fetches > before && !got.pending) || got.error || Date.now() > until) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  check(!got.error, `window error: ${got.error}`);
  check(got.fetches > before, 'no window asked of the server after zooming');
  check(got.drawn > 0, 'nothing drawn zoomed in');
  console.log(`zoomed to ${a}-${b} ms: ${got.fetches} windows fetched, ${got.drawn} spans drawn, level ${got.level}`);
  if (opt.name) {
    // The tooltip of the outermost lane at the left of the view names the event.
    const band = await page.evaluate((n) => window.spyglassReport.timeline.laneBand(n, 0), opt.tracks[0]);
    const box = await page.locator('#tl-canvas').boundingBox();
    const gutter = await page.evaluate(() => window.spyglassReport.timeline.gutter);
    check(band !== null, `no lane 0 of ${opt.tracks[0]} on the canvas`);
    if (band) {
      await page.mouse.move(box.x + gutter + 3, box.y + band[0] + band[1] / 2);
      await new Promise((r) => setTimeout(r, 100));
      const tip = await page.evaluate(() => document.getElementById('tl-tip').textContent);
      check(tip.startsWith(opt.name + '\n'), `tooltip "${tip}" is not one event named ${opt.name}`);
    }
  }
}
if (opt.report) {
  // What each section shows, as text, and how many flame frames it draws.
  const panels = (p) => p.evaluate(() => Object.fromEntries(['sg-steps', 'sg-summary', 'sg-cpu', 'sg-memory'].map((id) => {
    const e = document.getElementById(id);
    return [id, { text: e.innerText, canvases: e.querySelectorAll('canvas, svg').length }];
  })));
  const report = await browser.newPage();
  await report.goto('file://' + opt.report);
  await report.waitForFunction(() => document.body && (document.body.dataset.ready || document.body.dataset.error), null, { timeout: 60000 });
  const want = await panels(report), got = await panels(page);
  for (const id of Object.keys(want)) {
    check(got[id].text === want[id].text, `${id} differs from the report's:\n--- view\n${got[id].text.slice(0, 400)}\n--- report\n${want[id].text.slice(0, 400)}`);
    check(got[id].canvases === want[id].canvases, `${id}: ${got[id].canvases} drawings, the report's ${want[id].canvases}`);
  }
  check(!/^No summary/.test(got['sg-summary'].text), 'no summary in the view page');
  check(got['sg-memory'].canvases > 0, 'no memory flame graph in the view page');
  console.log(`panels as the report's: summary ${got['sg-summary'].text.length} chars, memory ${got['sg-memory'].canvases} drawings, cpu ${got['sg-cpu'].canvases}`);
}
check(outside.length === 0, `requests outside the server: ${outside.join(', ')}`);
check(errors.length === 0, `script errors: ${errors.join('; ')}`);
await browser.close();
if (problems.length) { for (const p of problems) console.error('FAIL: ' + p); process.exit(1); }
console.log('view_check: passed');
