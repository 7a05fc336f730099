// speedscope (npm `speedscope`, its own web app) opens a trace-event JSON
// file written by Spyglass, in Debian's chromium driven headless:
//   node speedscope_check.mjs TRACE.json[.gz] EXPECTED_NAME...
// Passes when speedscope shows the file as a profile (no "Unrecognized
// format" alert, no page error) and its Sandwich table lists every expected
// event name.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [tracePath, ...expected] = process.argv.slice(2);
if (!tracePath || expected.length === 0) {
  console.error('usage: node speedscope_check.mjs TRACE.json[.gz] EXPECTED_NAME...');
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const app = path.join(here, 'node_modules', 'speedscope', 'dist', 'release', 'index.html');
const browserPath = process.env.CHROMIUM || '/usr/bin/chromium';

let bytes = fs.readFileSync(tracePath);
if (bytes[0] === 0x1f && bytes[1] === 0x8b) bytes = zlib.gunzipSync(bytes);
const name = path.basename(tracePath).replace(/\.gz$/, '');
// speedscope's documented way to open a local file: a script that hands it
// the bytes, named in the URL fragment.
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'speedscope-'));
const loader = path.join(tmp, 'profile.js');
fs.writeFileSync(loader, `speedscope.loadFileFromBase64(${JSON.stringify(name)}, ${JSON.stringify(bytes.toString('base64'))})`);

const problems = [];
const browser = await chromium.launch({
  executablePath: browserPath,
  args: ['--allow-file-access-from-files', '--no-sandbox'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('dialog', async (d) => { problems.push(`dialog: ${d.message()}`); await d.dismiss(); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${pathToFileURL(app).href}#localProfilePath=${loader}`);
  // Once the import succeeded the toolbar names the first profile (one per
  // thread): "<process>, <thread> (1/N)"; a failed import never gets there.
  try {
    // A file of one profile (pprof) is named alone, without "(1/N)".
    await page.getByText(/\(1\/\d+\)/).or(page.locator(`text=${name}`)).first().waitFor({ timeout: 30000 });
  } catch {
    problems.push('no profile was shown');
  }
  if (problems.length === 0) await page.getByText('Sandwich').first().click();
  // SORT_BY_TOTAL=1: the table by total time (a sampled profile's callers
  // have no self time: by self they sit below the rows the table draws).
  if (problems.length === 0 && process.env.SORT_BY_TOTAL) await page.getByText('Total', { exact: true }).first().click();
  const missing = [];
  for (const e of problems.length ? [] : expected) {
    try {
      // speedscope appends an event's args to its name: `matmul {"n":"160"}`.
      const escaped = e.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
      await page.getByText(new RegExp(`^${escaped}( \\{.*\\})?$`)).first().waitFor({ timeout: 10000 });
    } catch {
      missing.push(e);
    }
  }
  if (missing.length) problems.push(`not in speedscope's Sandwich table: ${missing.join(', ')}`);
  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });
} finally {
  await browser.close();
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (problems.length) {
  console.error(`FAIL: speedscope does not read ${tracePath}:\n  ${problems.join('\n  ')}`);
  process.exit(1);
}
console.log(`ok: speedscope shows ${name} with ${expected.join(', ')}`);
