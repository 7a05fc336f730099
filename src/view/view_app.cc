#include "view/view_app.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "report/report.h"

namespace spyglass::view {

std::string_view embedded_view_js();

namespace {

bool ParseInt(const std::map<std::string, std::string>& q, const char* key, int64_t* out) {
  auto it = q.find(key);
  if (it == q.end() || it->second.empty() || it->second.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

nlohmann::json Levels(const std::vector<report::TimelineLevel>& levels) {
  nlohmann::json out = nlohmann::json::array();
  for (const report::TimelineLevel& l : levels) out.push_back({l.threshold_ns, l.spans, l.offset, l.bytes});
  return out;
}

}  // namespace

ViewApp::ViewApp(const ViewIndex* index, report::ReportInput in) : index_(index) {
  const report::Timeline& tl = index->timeline();
  in.timeline = index->Window(0, tl.duration_ns, kFirstPaintPixels);
  in.timeline.names = tl.names;
  in.timeline.details = tl.details;
  // Search counts and flows are the whole run's (flows find their ends at any level).
  in.timeline.name_events = tl.name_events;
  in.timeline.hidden_names = tl.hidden_names;
  in.timeline.flows = tl.flows;
  in.timeline.hidden_flows = tl.hidden_flows;
  in.notes.push_back("served by spyglass view: the timeline loads what it shows as you zoom (" +
                     std::to_string(tl.events) + " events in all)");
  // The page may fetch from this server (and nothing else), and view.js runs after the report's code.
  std::string page = report::RenderReport(in, kViewPolicy);
  std::string script = "<script>" + std::string(embedded_view_js()) + "</script>\n";
  if (size_t at = page.rfind("</body>"); at != std::string::npos) page.insert(at, script);
  page_ = std::move(page);
}

namespace {

// The token is in the page's own URL: /progress is asked with it.
constexpr std::string_view kIndexingPage = R"(<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>spyglass view: indexing</title>
<style>body{font:14px system-ui,sans-serif;margin:3em;color:#222}progress{width:30em;height:1.2em}</style>
</head><body>
<h1>spyglass view</h1>
<p id="what">Indexing the run: the timeline opens when it is ready.</p>
<progress id="bar" max="1" value="0"></progress> <span id="pct"></span>
<script>
const q = location.search;
const mib = b => (b / 1048576).toFixed(b < 10485760 ? 1 : 0) + ' MiB';
async function poll() {
  try {
    const r = await fetch('progress' + q, {cache: 'no-store'});
    const p = await r.json();
    if (p.ready) { location.reload(); return; }
    const f = p.size > 0 ? Math.min(1, p.read / p.size) : 0;
    document.getElementById('bar').value = f;
    document.getElementById('pct').textContent = p.events.toLocaleString('en-US') + ' events, ' + mib(p.read) + ' of ' + mib(p.size) + ' read' +
        (p.pass > 1 ? ' (a thread out of order: reading again)' : '');
  } catch (e) {}
  setTimeout(poll, 250);
}
poll();
</script>
</body></html>
)";

}  // namespace

HttpResponse IndexingResponse(const HttpRequest& req, const BuildProgress& progress) {
  if (req.path == "/" || req.path == "/index.html")
    return {200, "text/html; charset=utf-8", std::string(kIndexingPage)};
  if (req.path == "/progress")
    return {200, "application/json",
            nlohmann::json{{"ready", false},
                           {"events", progress.events.load()},
                           {"read", progress.read.load()},
                           {"size", progress.size.load()},
                           {"pass", progress.pass.load()}}
                .dump()};
  return {503, "text/plain; charset=utf-8", "the run is still being indexed: see /progress\n"};
}

HttpResponse ViewApp::Handle(const HttpRequest& req) const {
  if (req.path == "/" || req.path == "/index.html") return {200, "text/html; charset=utf-8", page_};
  if (req.path == "/progress") return {200, "application/json", R"({"ready": true})"};
  if (req.path == "/window") {
    int64_t t0 = 0, t1 = 0, px = 0;
    if (!ParseInt(req.query, "t0", &t0) || !ParseInt(req.query, "t1", &t1) || !ParseInt(req.query, "px", &px) || px < 1 ||
        px > kMaxWindowPixels || t1 < t0)
      return {400, "text/plain; charset=utf-8",
              "window: give t0 and t1 (ns from the run's start, t0 <= t1) and px (1.." + std::to_string(kMaxWindowPixels) + ")\n"};
    report::Timeline w = index_->Window(t0, t1, static_cast<int>(px));
    nlohmann::json tracks = nlohmann::json::array(), counters = nlohmann::json::array();
    for (const report::TimelineTrack& t : w.tracks) {
      nlohmann::json lanes = nlohmann::json::array();
      for (const auto& levels : t.lanes) lanes.push_back(Levels(levels));
      tracks.push_back(std::move(lanes));
    }
    for (const report::TimelineCounter& c : w.counters) counters.push_back(Levels(c.levels));
    std::string head = nlohmann::json{{"t0", t0}, {"t1", t1}, {"px", px}, {"tracks", tracks}, {"counters", counters}}.dump();
    std::string body;
    uint32_t n = static_cast<uint32_t>(head.size());
    for (int i = 0; i < 4; i++) body.push_back(static_cast<char>((n >> (8 * i)) & 255));
    body += head;
    body += w.blob;
    return {200, "application/octet-stream", std::move(body)};
  }
  return {404, "text/plain; charset=utf-8", "not found\n"};
}

}  // namespace spyglass::view
