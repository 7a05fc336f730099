#include "sampling/cpu_model.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <map>
#include <tuple>
#include <unordered_map>

#include "memory/pprof.h"
#include "memory/symbolize.h"
#include "memory/tracker.h"
#include "sampling/firefox_profile.h"
#include "model/schema.h"

namespace spyglass::sampling {
namespace {

const model::Stat* FindStat(const model::Plane& plane, const std::vector<model::Stat>& stats, std::string_view key) {
  for (const model::Stat& s : stats)
    if (plane.stat_name(s) == key) return &s;
  return nullptr;
}

std::string_view RefText(const model::Plane& plane, const model::Stat& s) {
  if (s.kind == model::StatKind::kRef && s.ref < plane.stat_metadata().size()) return plane.stat_metadata()[s.ref].name;
  return plane.stat_str(s);
}

// The annotation stacks of one thread's samples, from its host line: the
// events open at each time (outer::inner); "" where none.
std::vector<std::string> AnnotationsAt(const model::Plane& plane, const model::Line* line,
                                       const std::vector<int64_t>& times_ps) {
  std::vector<std::string> out(times_ps.size());
  if (line == nullptr || line->events.empty()) return out;
  std::vector<const model::Event*> events;
  events.reserve(line->events.size());
  for (const model::Event& e : line->events) events.push_back(&e);
  std::stable_sort(events.begin(), events.end(), [](const model::Event* a, const model::Event* b) {
    return a->offset_ps != b->offset_ps ? a->offset_ps < b->offset_ps : a->duration_ps > b->duration_ps;
  });
  auto name_of = [&](const model::Event* e) -> const std::string& {
    const model::EventMetadata& md = plane.event_metadata()[e->metadata_id];
    return md.display_name.empty() ? md.name : md.display_name;
  };
  std::vector<const model::Event*> open;
  size_t next = 0;
  for (size_t i = 0; i < times_ps.size(); ++i) {  // times ascending
    const int64_t t = times_ps[i];
    while (next < events.size() && events[next]->offset_ps <= t) {
      const model::Event* e = events[next++];
      while (!open.empty() && open.back()->offset_ps + open.back()->duration_ps <= e->offset_ps) open.pop_back();
      open.push_back(e);
    }
    // Ended ones may sit under one still open (nesting broken by a drop): dropped wherever they are.
    open.erase(std::remove_if(open.begin(), open.end(),
                              [t](const model::Event* e) { return e->offset_ps + e->duration_ps <= t; }),
               open.end());
    std::string s;
    for (const model::Event* e : open) s += (s.empty() ? "" : "::") + name_of(e);
    out[i] = std::move(s);
  }
  return out;
}

}  // namespace

void AddSamplesToPlane(CpuCapture cap, uint64_t start_mono_ns, SampleMode mode, model::Plane* host) {
  host->stats.push_back(host->uint_stat(kCpuSampleCountStat, cap.samples.size()));
  host->stats.push_back(host->uint_stat(kCpuSamplePeriodStat, cap.period_ns));
  host->stats.push_back(host->str_stat(kCpuSampleModeStat, mode == SampleMode::kWall ? "wall" : "cpu"));
  host->stats.push_back(host->str_stat(kCpuSampleMechanismStat, cap.mechanism));
  host->stats.push_back(host->uint_stat(kCpuSamplesLostStat, cap.lost));
  host->stats.push_back(host->uint_stat(kCpuSamplesDroppedStat, cap.dropped));
  host->stats.push_back(host->uint_stat(kCpuStacksTruncatedStat, cap.truncated_samples));
  host->stats.push_back(host->uint_stat(kCpuUnwindNsStat, cap.unwind_ns));
  host->stats.push_back(host->uint_stat(kCpuReaderCpuNsStat, cap.reader_cpu_ns));
  if (cap.samples.empty()) return;

  // Symbolize every address once.
  std::vector<uintptr_t> pcs;
  for (const auto& st : cap.stacks)
    for (uintptr_t w : st)
      if (!memory::internal::IsSymbolicFrame(w)) pcs.push_back(w);  // Python frames are named already
  std::sort(pcs.begin(), pcs.end());
  pcs.erase(std::unique(pcs.begin(), pcs.end()), pcs.end());
  std::unordered_map<uintptr_t, memory::internal::SymLocation> syms;
  {
    memory::internal::ScopedUntracked untracked;  // the profiler's own allocations
    syms = memory::internal::Symbolize(pcs);
  }

  // The trie of nodes, outermost first.
  std::map<std::tuple<uint32_t, std::string, std::string, int64_t, uint64_t, bool>, uint32_t> nodes;
  uint32_t next_node = 0;
  auto node = [&](uint32_t parent, const std::string& fn, const std::string& file, int64_t line, uint64_t address,
                  bool python = false) {
    auto [it, inserted] = nodes.emplace(std::make_tuple(parent, fn, file, line, address, python), 0);
    if (!inserted) return it->second;
    uint32_t id = host->intern_event(std::string(kCpuStackNodePrefix) + std::to_string(next_node++));
    model::EventMetadata& md = host->event_metadata_at(id);
    md.display_name = model::ValidUtf8(fn);
    std::vector<model::Stat> stats;
    stats.push_back(host->ref_stat(kCpuFrameStat, md.display_name));
    if (!file.empty()) stats.push_back(host->ref_stat(kCpuFileStat, model::ValidUtf8(file)));
    if (line > 0) stats.push_back(host->int_stat(kCpuLineStat, line));
    if (address != 0) stats.push_back(host->uint_stat(kCpuAddressStat, address));
    if (parent != 0) stats.push_back(host->uint_stat(kCpuParentStat, parent));
    stats.push_back(host->ref_stat(kCpuFrameKindStat, python ? "python" : "native"));
    host->event_metadata_at(id).stats = std::move(stats);
    it->second = id;
    return id;
  };
  std::vector<uint32_t> leaf_of(cap.stacks.size());
  for (size_t i = 0; i < cap.stacks.size(); ++i) {
    uint32_t parent = 0;
    if (cap.truncated[i]) parent = node(0, std::string(kTruncatedFrame), "", 0, 0);
    const auto& st = cap.stacks[i];
    for (size_t k = st.size(); k-- > 0;) {
      if (memory::internal::IsSymbolicFrame(st[k])) {  // a Python frame (python_stacks.h)
        std::string_view fn = "<unknown>", file;
        memory::internal::FunctionNames(memory::internal::SymbolicFunction(st[k]), &fn, &file);
        // (The sampler's own markers, "[off CPU: ...]", have no file: native kind.)
        parent = node(parent, std::string(fn), std::string(file), memory::internal::SymbolicLine(st[k]), 0, !file.empty());
        continue;
      }
      auto it = syms.find(st[k]);
      if (it == syms.end() || it->second.frames.empty()) {
        char buf[32];
        snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(st[k] - 1));
        parent = node(parent, buf, "", 0, st[k] - 1);
        continue;
      }
      const auto& frames = it->second.frames;  // inlined: innermost first
      for (size_t f = frames.size(); f-- > 0;)
        parent = node(parent, frames[f].function, frames[f].file, frames[f].line, it->second.rel_address);
    }
    leaf_of[i] = parent;
  }

  std::stable_sort(cap.samples.begin(), cap.samples.end(), [](const CpuSample& a, const CpuSample& b) {
    return a.tid != b.tid ? a.tid < b.tid : a.time_ns < b.time_ns;
  });
  size_t i = 0;
  while (i < cap.samples.size()) {
    const uint32_t tid = cap.samples[i].tid;
    size_t j = i;
    while (j < cap.samples.size() && cap.samples[j].tid == tid) ++j;
    std::vector<int64_t> times;
    for (size_t k = i; k < j; ++k)
      times.push_back(cap.samples[k].time_ns > start_mono_ns
                          ? static_cast<int64_t>(cap.samples[k].time_ns - start_mono_ns) * 1000
                          : 0);
    const model::Line* thread_line = nullptr;
    for (const model::Line& l : host->lines)
      if (l.id == tid) thread_line = &l;
    std::vector<std::string> annotations = AnnotationsAt(*host, thread_line, times);
    model::Line& line = host->line_with_id(kCpuSampleLineIdBase + tid);
    line.name = std::string(kCpuSamplesLineName);
    std::string comm = cap.thread_names.count(tid) ? cap.thread_names[tid] : "";
    line.display_name = model::ValidUtf8(comm) + " " + std::to_string(tid) + " CPU samples";
    line.timestamp_ns = 0;
    line.events.reserve(j - i);
    for (size_t k = i; k < j; ++k) {
      model::Event e;
      e.offset_ps = times[k - i];
      e.duration_ps = static_cast<int64_t>(cap.samples[k].period_ns) * 1000;
      e.metadata_id = leaf_of[cap.samples[k].stack];
      if (!annotations[k - i].empty()) {
        model::Stat s = host->ref_stat(model::kAnnotationStackStat, model::ValidUtf8(annotations[k - i]));
        line.add_stats(e, {&s, 1});
      }
      line.events.push_back(e);
    }
    i = j;
  }
}

namespace {

std::string TableField(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\t' || c == '\n') c = ' ';
  return out;
}

struct TableNode {
  std::string_view parent, kind, function, file;
  int64_t line = 0;
  uint64_t address = 0;
};

// The parsed table of the last plane asked (readers ask once per leaf).
struct ParsedTable {
  const model::Plane* plane = nullptr;
  const char* text = nullptr;
  size_t hash = 0;  // of the text: a plane at a freed one's address is not taken for it
  std::unordered_map<std::string_view, TableNode> nodes;
};

const ParsedTable& TableOf(const model::Plane& plane, std::string_view text) {
  thread_local ParsedTable cached;
  const size_t hash = std::hash<std::string_view>{}(text);
  if (cached.plane == &plane && cached.text == text.data() && cached.hash == hash) return cached;
  cached = ParsedTable{&plane, text.data(), hash, {}};
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view row = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    std::string_view f[7];
    for (int i = 0; i < 7; ++i) {
      size_t tab = i < 6 ? row.find('\t') : std::string_view::npos;
      f[i] = row.substr(0, tab);
      row = tab == std::string_view::npos ? std::string_view() : row.substr(tab + 1);
    }
    TableNode n{f[1], f[2], f[5], f[6]};
    n.address = std::strtoull(std::string(f[3]).c_str(), nullptr, 10);
    n.line = std::strtoll(std::string(f[4]).c_str(), nullptr, 10);
    cached.nodes.emplace(f[0], n);
  }
  return cached;
}

}  // namespace

void MakeCpuStacksPortable(model::Plane* host) {
  std::string table;
  for (size_t id = 1; id < host->event_metadata().size(); ++id) {
    model::EventMetadata& md = host->event_metadata_at(static_cast<uint32_t>(id));
    if (md.name.rfind(kCpuStackNodePrefix, 0) != 0) continue;
    ModelFrame f;
    std::string parent;
    std::vector<model::Stat> kept;
    for (const model::Stat& s : md.stats) {
      std::string_view key = host->stat_name(s);
      if (key == kCpuParentStat) {
        if (s.u64 < host->event_metadata().size()) parent = host->event_metadata()[s.u64].name;
        continue;
      }
      if (key == kCpuFileStat) f.file = RefText(*host, s);
      else if (key == kCpuLineStat) f.line = s.i64;
      else if (key == kCpuAddressStat) f.address = s.u64;
      else if (key == kCpuFrameKindStat) f.python = RefText(*host, s) == "python";
      kept.push_back(s);
    }
    table += md.name + "\t" + parent + "\t" + (f.python ? "python" : "native") + "\t" + std::to_string(f.address) +
             "\t" + std::to_string(f.line) + "\t" + TableField(md.display_name) + "\t" + TableField(f.file) + "\n";
    md.stats = std::move(kept);
  }
  if (!table.empty()) host->stats.push_back(host->str_stat(kCpuStackTableStat, std::move(table)));
}

ModelFrame FrameOfNode(const model::Plane& plane, uint32_t node, uint32_t* parent) {
  const model::EventMetadata& md = plane.event_metadata()[node];
  ModelFrame f;
  f.function = md.display_name;
  *parent = 0;
  for (const model::Stat& s : md.stats) {
    std::string_view key = plane.stat_name(s);
    if (key == kCpuFileStat) f.file = RefText(plane, s);
    else if (key == kCpuLineStat) f.line = s.i64;
    else if (key == kCpuAddressStat) f.address = s.u64;
    else if (key == kCpuParentStat) *parent = static_cast<uint32_t>(s.u64);
    else if (key == kCpuFrameKindStat) f.python = RefText(plane, s) == "python";
  }
  if (*parent >= plane.event_metadata().size()) *parent = 0;
  return f;
}

std::string ProcessFileName(const model::Plane& host, std::string_view prefix, std::string_view suffix) {
  const model::Stat* pid = FindStat(host, host.stats, model::kProcessIdStat);
  const model::Stat* comm = FindStat(host, host.stats, model::kProcessNameStat);
  std::string name = std::string(prefix) + "." + (pid ? host.stat_text(*pid) : std::string("0")) + ".";
  const std::string c = comm ? host.stat_text(*comm) : "";
  const size_t plain_from = name.size();
  for (char ch : std::string_view(c).substr(0, 64))
    name.push_back((isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-') ? ch : '_');
  if (name.size() == plain_from) name += "process";
  return name + std::string(suffix);
}

std::vector<ModelFrame> StackOfNode(const model::Plane& plane, uint32_t leaf) {
  std::vector<ModelFrame> out;
  if (const model::Stat* t = FindStat(plane, plane.stats, kCpuStackTableStat)) {
    if (leaf == 0 || leaf >= plane.event_metadata().size()) return out;
    const ParsedTable& table = TableOf(plane, plane.stat_str(*t));
    std::string_view name = plane.event_metadata()[leaf].name;
    for (int guard = 0; !name.empty() && guard < 4096; ++guard) {
      auto it = table.nodes.find(name);
      if (it == table.nodes.end()) break;
      ModelFrame f;
      f.function = it->second.function;
      f.file = it->second.file;
      f.line = it->second.line;
      f.address = it->second.address;
      f.python = it->second.kind == "python";
      out.push_back(f);
      name = it->second.parent;
    }
    return out;
  }
  for (int guard = 0; leaf != 0 && leaf < plane.event_metadata().size() && guard < 4096; ++guard) {
    uint32_t parent = 0;
    out.push_back(FrameOfNode(plane, leaf, &parent));
    leaf = parent;
  }
  return out;
}

Status WriteCpuProfiles(const model::Space& space, const exporter::OutputDir& dir, std::vector<std::string>* written) {
  for (const model::Plane& plane : space.planes) {
    if (plane.name.rfind(model::kHostPlaneName, 0) != 0) continue;
    const model::Stat* period = FindStat(plane, plane.stats, kCpuSamplePeriodStat);
    if (period == nullptr) continue;
    memory::ProfileData data;
    data.sample_types = {{"samples", "count"}, {"cpu", "nanoseconds"}};
    data.period_type = {"cpu", "nanoseconds"};
    data.period = static_cast<int64_t>(period->u64);
    memory::internal::LocationTable table(&data);
    std::unordered_map<uint32_t, std::vector<uint64_t>> locations_of;  // leaf node -> location ids
    std::map<std::tuple<uint64_t, std::string, std::string, int64_t>, uint64_t> location_ids;
    std::map<std::tuple<uint32_t, std::string, std::string_view>, std::pair<int64_t, int64_t>> agg;
    int64_t first_ps = INT64_MAX, last_ps = 0;
    for (const model::Line& line : plane.lines) {
      if (line.name != kCpuSamplesLineName) continue;
      size_t cut = line.display_name.rfind(" CPU samples");
      std::string thread = cut == std::string::npos ? line.display_name : line.display_name.substr(0, cut);
      for (const model::Event& e : line.events) {
        std::string_view annotation;
        for (const model::Stat& s : line.stats_of(e))
          if (plane.stat_name(s) == model::kAnnotationStackStat) annotation = RefText(plane, s);
        auto& v = agg[{e.metadata_id, thread, annotation}];
        v.first += 1;
        v.second += e.duration_ps / 1000;
        first_ps = std::min(first_ps, e.offset_ps);
        last_ps = std::max(last_ps, e.offset_ps + e.duration_ps);
      }
    }
    // A process that never ran while sampled still gets its (empty) profile: sampling was on.
    for (const auto& [key, v] : agg) {
      const uint32_t leaf = std::get<0>(key);
      auto [it, inserted] = locations_of.emplace(leaf, std::vector<uint64_t>{});
      if (inserted) {
        for (const ModelFrame& f : StackOfNode(plane, leaf)) {
          auto lk = std::make_tuple(f.address, std::string(f.function), std::string(f.file), f.line);
          auto [lit, fresh] = location_ids.emplace(lk, 0);
          if (fresh) {
            uint64_t fn = table.Function(std::string(f.function), std::string(f.function), std::string(f.file), 0);
            data.locations.push_back({f.address, {{fn, f.line}}});
            lit->second = data.locations.size();
          }
          it->second.push_back(lit->second);
        }
      }
      memory::ProfileSample s;
      s.location_ids = it->second;
      s.count = v.first;
      s.bytes = v.second;
      s.labels.push_back({"thread", std::get<1>(key)});
      if (!std::get<2>(key).empty()) s.labels.push_back({"annotation", std::string(std::get<2>(key))});
      data.samples.push_back(std::move(s));
    }
    data.duration_nanos = last_ps > first_ps ? (last_ps - first_ps) / 1000 : 0;
    const model::Stat* pid = FindStat(plane, plane.stats, model::kProcessIdStat);
    const model::Stat* comm = FindStat(plane, plane.stats, model::kProcessNameStat);
    for (std::string_view key : {kCpuSampleMechanismStat, kCpuSamplesLostStat, kCpuSamplesDroppedStat,
                                 kCpuStacksTruncatedStat, kCpuUnwindNsStat, kCpuReaderCpuNsStat})
      if (const model::Stat* s = FindStat(plane, plane.stats, key))
        data.comments.push_back("spyglass: " + std::string(key) + " " + plane.stat_text(*s));
    const std::string name = ProcessFileName(plane, "cpu", ".prof");
    std::string bytes = memory::EncodePprofGz(data);
    if (Status s = dir.WriteBytes(name, bytes); !s.ok()) return s;
    if (written) written->push_back(dir.PathOf(name));
  }
  // Beside them, the same samples for the Firefox Profiler (firefox_profile.h).
  return WriteFirefoxProfiles(space, dir, written);
}

}  // namespace spyglass::sampling
