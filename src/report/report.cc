#include "report/report.h"

#include <nlohmann/json.hpp>

#include <map>
#include <tuple>
#include <unordered_map>

#include "common/gzip.h"
#include "report/timeline.h"
#include "spyglass/profiler.h"

namespace spyglass::report {

// The page's code (src/report/web/), compiled in by cmake/embed_files.cmake.
std::string_view embedded_report_html();
std::string_view embedded_report_css();
std::string_view embedded_report_js();

namespace {

// Keys in the order written (the summary's order is the reading order).
using json = nlohmann::ordered_json;

std::string Base64(std::string_view in) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16 | static_cast<uint8_t>(in[i + 1]) << 8 | static_cast<uint8_t>(in[i + 2]);
    out += {kDigits[v >> 18], kDigits[(v >> 12) & 63], kDigits[(v >> 6) & 63], kDigits[v & 63]};
  }
  if (i + 1 == in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    out += {kDigits[v >> 18], kDigits[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16 | static_cast<uint8_t>(in[i + 1]) << 8;
    out += {kDigits[v >> 18], kDigits[(v >> 12) & 63], kDigits[(v >> 6) & 63], '='};
  }
  return out;
}

json TimelineJson(const Timeline& tl) {
  json tracks = json::array();
  for (const TimelineTrack& t : tl.tracks) {
    json lanes = json::array();
    for (const auto& levels : t.lanes) {
      json lane = json::array();
      for (const TimelineLevel& l : levels) {
        json level = {l.threshold_ns, l.spans, l.offset, l.bytes};
        if (!l.marks.empty()) level.push_back(l.marks);
        lane.push_back(std::move(level));
      }
      lanes.push_back(std::move(lane));
    }
    tracks.push_back({{"plane", t.plane}, {"name", t.name}, {"id", t.id}, {"at_ns", t.at_ns}, {"events", t.events}, {"hidden", t.hidden},
                      {"lanes", std::move(lanes)}});
  }
  json counters = json::array();
  for (const TimelineCounter& c : tl.counters) {
    json levels = json::array();
    for (const TimelineLevel& l : c.levels) levels.push_back({l.threshold_ns, l.spans, l.offset, l.bytes});
    counters.push_back({{"plane", c.plane}, {"name", c.name}, {"bytes", c.bytes}, {"at_ns", c.at_ns}, {"samples", c.samples},
                        {"min", c.min}, {"max", c.max}, {"levels", std::move(levels)}});
  }
  // Flows flat: from track, lane, ns, to track, lane, ns.
  json flows = json::array();
  for (const TimelineFlow& f : tl.flows)
    for (int64_t v : {int64_t{f.from_track}, int64_t{f.from_lane}, f.from_ns, int64_t{f.to_track}, int64_t{f.to_lane}, f.to_ns})
      flows.push_back(v);
  return {{"start_ns", tl.start_ns}, {"duration_ns", tl.duration_ns}, {"events", tl.events},
          {"names", tl.names}, {"name_events", tl.name_events}, {"hidden_names", tl.hidden_names},
          {"flows", std::move(flows)}, {"hidden_flows", tl.hidden_flows},
          {"coarsened_lanes", tl.coarsened_lanes}, {"coarsened_events", tl.coarsened_events},
          {"coarsened_counters", tl.coarsened_counters}, {"coarsened_ns", tl.coarsened_ns}, {"chunk_spans", kChunkSpans},       {"details", tl.details},          {"hidden_details", tl.hidden_details},
          {"tracks", std::move(tracks)},    {"counters", std::move(counters)},
          {"blob_bytes", tl.blob.size()},
          {"hidden_tracks", tl.hidden_tracks}, {"hidden_track_events", tl.hidden_track_events},
          {"hidden_counters", tl.hidden_counters}, {"hidden_counter_samples", tl.hidden_counter_samples}};
}

json FlameJson(const FlameGraph& g) {
  json sites = json::array();
  for (const FlameSite& s : g.top_sites) sites.push_back({{"site", s.site}, {"value", s.value}, {"count", s.count}});
  // Frames as columns; function and file names interned once.
  std::vector<std::string> strings;
  std::unordered_map<std::string, uint32_t> ids;
  auto id = [&](const std::string& s) {
    auto [it, added] = ids.emplace(s, static_cast<uint32_t>(strings.size()));
    if (added) strings.push_back(s);
    return it->second;
  };
  json fn = json::array(), file = json::array(), line = json::array(), kind = json::array();
  for (const FlameFrame& f : g.frames) {
    fn.push_back(id(f.function));
    file.push_back(id(f.file));
    line.push_back(f.line);
    kind.push_back(f.label ? 3 : f.interpreter ? 2 : f.python ? 1 : 0);
  }
  json out = {{"title", g.title}, {"unit", g.unit}, {"total", g.total}, {"strings", std::move(strings)},
          {"frame_fn", std::move(fn)}, {"frame_file", std::move(file)}, {"frame_line", std::move(line)},
          {"frame_kind", std::move(kind)}, {"stack_frames", g.stack_frames}, {"stack_sizes", g.stack_sizes},
          {"stack_values", g.stack_values}, {"stack_counts", g.stack_counts}, {"hidden_stacks", g.hidden_stacks},
          {"hidden_value", g.hidden_value}, {"fold", g.fold},
          {"sites", std::move(sites)}, {"negative_samples", g.negative_samples}};
  if (g.cpu) {
    out["cpu"] = true;
    out["threads"] = g.threads;
    out["annotations"] = g.annotations;
    out["stack_thread"] = g.stack_thread;
    out["stack_annotation"] = g.stack_annotation;
  }
  return out;
}

json CpuSamplesJson(const CpuSampleSet& s, int64_t start_ns) {
  return {{"title", s.title}, {"strings", s.strings}, {"node_parent", s.node_parent}, {"node_fn", s.node_fn},
          {"node_file", s.node_file}, {"node_line", s.node_line}, {"node_kind", s.node_kind}, {"threads", s.threads},
          {"samples", s.samples}, {"hidden_samples", s.hidden_samples}, {"first_ns", s.first_ns - start_ns},
          {"encoded", Base64(GzipCompress(s.encoded, 6))}};
}

json MemoryTimelineJson(const std::string& title, const memory::Timeline& m) {
  json sites = json::array();
  std::unordered_map<uint32_t, size_t> index;
  for (const memory::TimelineSite& s : m.sites) {
    index.emplace(s.id, sites.size());
    sites.push_back({{"device", s.device}, {"stack", s.stack}});
  }
  json t = json::array(), live = json::array(), max = json::array(), top = json::array();
  for (const memory::TimelinePoint& p : m.points) {
    t.push_back(p.t_ns);
    live.push_back(p.live);
    max.push_back(p.max);
    json at = json::array();
    for (auto [id, bytes] : p.sites) {
      auto it = index.find(id);
      if (it != index.end()) at.push_back({it->second, bytes});
    }
    top.push_back(std::move(at));
  }
  return {{"title", title}, {"interval_ns", m.interval_ns}, {"devices", m.devices}, {"peak", m.peak_bytes},
          {"sites", std::move(sites)}, {"t", std::move(t)}, {"live", std::move(live)}, {"max", std::move(max)},
          {"top", std::move(top)}, {"top_per_point", memory::kTimelineTopSites}};
}

// JSON inside <script>: no '<' at all, so neither "</script>" nor "<!--"
// can end or change the element ('<' only occurs inside JSON strings).
std::string ScriptSafe(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string RenderReport(ReportInput& in, std::string_view policy) {
  Timeline& tl = in.timeline;
  json summary = in.summary_json.empty() ? json(nullptr) : json::parse(in.summary_json, nullptr, false);
  if (summary.is_discarded()) summary = nullptr;
  json flames = json::array();
  for (const FlameGraph& g : in.flames) flames.push_back(FlameJson(g));
  json cpu_flames = json::array();
  for (const FlameGraph& g : in.cpu_flames) cpu_flames.push_back(FlameJson(g));
  json cpu_samples = json::array();
  for (const CpuSampleSet& s : in.cpu_samples) cpu_samples.push_back(CpuSamplesJson(s, tl.start_ns));
  json memory_timelines = json::array();
  for (const auto& [title, m] : in.memory_timelines) memory_timelines.push_back(MemoryTimelineJson(title, m));
  const size_t code_bytes = embedded_report_html().size() + embedded_report_css().size() + embedded_report_js().size();
  std::string data_text, blob;
  // Over the budget: the finest levels go, those that weigh the most in the
  // page first (each level's size gzipped alone), until it fits.
  // By place in the blob and threshold (the coarsening writes levels of its own).
  std::map<std::tuple<uint64_t, uint64_t, int64_t>, uint64_t> weight;
  auto cost = [&](const TimelineLevel& l) {
    auto [it, added] = weight.try_emplace({l.offset, l.bytes, l.threshold_ns}, 0);
    if (added) it->second = (GzipCompress(std::string_view(tl.blob).substr(l.offset, l.bytes), 1).size() * 4 + 2) / 3;
    return it->second;
  };
  double scale = 1.0;
  for (int round = 0;; ++round) {
    json data = {{"title", in.title}, {"generator", std::string("spyglass ") + spyglass::version()},
                 {"notes", in.notes}, {"timeline", TimelineJson(tl)}, {"summary", summary}, {"flames", flames}, {"cpu_flames", cpu_flames},
                 {"cpu_samples", cpu_samples},
                 {"memory_timelines", memory_timelines}};
    // Invalid UTF-8 in a name (from a foreign file) becomes U+FFFD, not an exception.
    data_text = ScriptSafe(data.dump(-1, ' ', false, json::error_handler_t::replace));
    blob = Base64(GzipCompress(tl.blob, 6));
    const uint64_t other = code_bytes + data_text.size() + in.title.size() * 6 + 1024;
    if (other + blob.size() <= in.max_page_bytes || round == 4 || tl.blob.empty()) break;
    const uint64_t room = in.max_page_bytes > other ? in.max_page_bytes - other : 0;
    // The levels compressed alone weigh more than together: aim lower each round.
    const uint64_t before = tl.blob.size();
    CoarsenTimeline(&tl, static_cast<uint64_t>(static_cast<double>(room) * scale), cost);
    weight.clear();  // offsets moved
    if (tl.blob.size() == before) scale *= 0.5;
  }

  // The template's slots, each filled once, in order; what fills one is never rescanned.
  std::string page(embedded_report_html());
  std::string out;
  out.reserve(page.size() + data_text.size() + blob.size() + embedded_report_js().size() + 1024);
  const std::pair<std::string_view, std::string> slots[] = {
      {"{{POLICY}}", HtmlEscape(policy)},
      {"{{TITLE}}", HtmlEscape(in.title)},
      {"{{STYLE}}", std::string(embedded_report_css())},
      {"{{DATA}}", std::move(data_text)},
      {"{{BLOB}}", std::move(blob)},
      {"{{SCRIPT}}", std::string(embedded_report_js())},
  };
  size_t from = 0;
  for (const auto& [key, value] : slots) {
    size_t at = page.find(key, from);
    if (at == std::string::npos) continue;
    out.append(page, from, at - from);
    out += value;
    from = at + key.size();
  }
  out.append(page, from);
  return out;
}

}  // namespace spyglass::report
