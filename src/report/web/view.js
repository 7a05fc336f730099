// `spyglass view`'s part of the report page: the page comes with the whole
// run coarsened; as the timeline is zoomed or panned this asks the server
// (the page's own origin, with the page's token) for the window shown, at
// the resolution of the pixels, and hands it to the timeline
// (report.timeline.setData). Nothing else is fetched.
'use strict';
(function () {
  const report = window.spyglassReport;
  if (!report) return;
  const token = new URLSearchParams(location.search).get('token') || '';
  const view = (report.view = { fetches: 0, pending: false, have: null, error: null });
  let wanted = null, timer = null;
  // Enough data when it covers the view at least as finely as the pixels.
  function covers(h, t0, t1, plotPx) {
    if (!h) return false;
    const nsPerPx = (t1 - t0) / plotPx;
    return h.t0 <= t0 && t1 <= h.t1 && h.nsPerPx <= nsPerPx * 1.01 && h.nsPerPx * 8 >= nsPerPx;
  }
  async function load() {
    timer = null;
    if (view.pending || !wanted) return;
    const [t0, t1, plotPx] = wanted;
    wanted = null;
    // A view's width on each side: panning draws before the next answer.
    const span = t1 - t0;
    const a = Math.max(0, Math.floor(t0 - span)), b = Math.ceil(t1 + span);
    const px = Math.min(20000, Math.max(1, Math.round(plotPx * (b - a) / Math.max(span, 1))));
    view.pending = true;
    try {
      const r = await fetch(`window?token=${encodeURIComponent(token)}&t0=${a}&t1=${b}&px=${px}`, { cache: 'no-store' });
      if (!r.ok) throw new Error(`the server answered ${r.status}: ${await r.text()}`);
      const buf = new Uint8Array(await r.arrayBuffer());
      const n = new DataView(buf.buffer).getUint32(0, true);
      const head = JSON.parse(new TextDecoder().decode(buf.subarray(4, 4 + n)));
      view.have = { t0: a, t1: b, nsPerPx: (b - a) / px };
      report.timeline.setData(head.tracks, head.counters, buf.slice(4 + n));
      view.fetches++;
    } catch (e) {
      view.error = String(e && e.message || e);
      document.body.dataset.viewError = view.error;
    } finally {
      view.pending = false;
    }
    if (wanted) load();
  }
  // Called by the timeline after each draw with what it shows.
  report.onView = (t0, t1, plotPx) => {
    if (!report.timeline || covers(view.have, t0, t1, plotPx)) return;
    wanted = [t0, t1, plotPx];
    if (!timer) timer = setTimeout(load, 30);
  };
})();
