#include "report/cpu_samples.h"

#include <algorithm>
#include <unordered_map>

#include "model/schema.h"
#include "model/wire.h"
#include "model/xspace.h"
#include "model/xspace_read.h"
#include "sampling/cpu_model.h"

namespace spyglass::report {
namespace {

// The page's varints: the model's writer (model/wire.h).
void PutVarint(std::string* out, uint64_t v) { model::wire::PutVarint(v, out); }

std::string ProcessTitle(const model::Plane& plane) {
  std::string comm, pid;
  for (const model::Stat& s : plane.stats) {
    const std::string_view key = plane.stat_name(s);
    if (key == model::kProcessNameStat) comm = plane.stat_text(s);
    else if (key == model::kProcessIdStat) pid = plane.stat_text(s);
  }
  if (comm.empty() && pid.empty()) return plane.name;
  return comm.empty() ? "pid " + pid : pid.empty() ? comm : comm + " " + pid;
}

}  // namespace

Status AddCpuSamples(const std::string& path, const std::string& host, TimelineBuilder* timeline,
                     std::vector<CpuSampleSet>* out) {
  model::Space space;
  if (Status s = model::ReadXSpaceFile(path, &space); !s.ok()) return s;
  for (const model::Plane& plane : space.planes) {
    if (plane.name.rfind(model::kHostPlaneName, 0) != 0) continue;
    struct Sample {
      int64_t ns;
      uint32_t leaf, thread;
      int64_t cpu_ns;
    };
    std::vector<Sample> samples;
    CpuSampleSet set;
    std::string detail;
    for (const model::Line& line : plane.lines) {
      if (line.name != sampling::kCpuSamplesLineName || line.events.empty()) continue;
      std::string thread = line.display_name;
      if (size_t cut = thread.rfind(" CPU samples"); cut != std::string::npos) thread.resize(cut);
      const auto t = static_cast<uint32_t>(set.threads.size());
      set.threads.push_back(std::move(thread));
      timeline->BeginLine(host.empty() ? plane.name : host + " " + plane.name,
                          line.display_name.empty() ? line.name : line.display_name, line.id);
      for (const model::Event& e : line.events) {
        if (e.metadata_id >= plane.event_metadata().size()) continue;
        const model::EventMetadata& md = plane.event_metadata()[e.metadata_id];
        detail.clear();
        for (const model::Stat& s : line.stats_of(e))
          if (plane.stat_name(s) == model::kAnnotationStackStat) detail = std::string(model::kAnnotationStackStat) + "=" + plane.stat_text(s);
        timeline->AddEvent(md.display_name.empty() ? md.name : md.display_name, line.timestamp_ns * 1000 + e.offset_ps,
                           e.duration_ps, detail);
        if (e.metadata_id != 0) samples.push_back({line.timestamp_ns + e.offset_ps / 1000, e.metadata_id, t, e.duration_ps / 1000});
      }
      timeline->EndLine();
    }
    if (samples.empty() || out == nullptr) continue;  // the timeline's lines only
    std::stable_sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.ns < b.ns; });
    if (samples.size() > kMaxReportSamples) {
      set.hidden_samples = samples.size() - kMaxReportSamples;
      samples.resize(kMaxReportSamples);
    }
    set.title = (host.empty() ? "" : host + " ") + ProcessTitle(plane);
    set.strings.push_back("");
    std::unordered_map<std::string, uint32_t> string_ids{{"", 0}};
    auto str = [&](std::string_view s) {
      auto [it, added] = string_ids.emplace(std::string(s), static_cast<uint32_t>(set.strings.size()));
      if (added) set.strings.emplace_back(s);
      return it->second;
    };
    // Node index + 1 by metadata id (0: not reached yet); each node read
    // once, walking up from a leaf to a node already reached.
    std::vector<uint32_t> index(plane.event_metadata().size());
    std::vector<std::pair<uint32_t, uint32_t>> pending;  // (new node, its caller's metadata id)
    // A plane merged by event name (XLA's merge of the plugin's plane)
    // carries its stacks as a table (sampling::kCpuStackTableStat), not as
    // node ids: its stacks are read whole and their frames interned by
    // (caller, frame).
    bool portable = false;
    for (const model::Stat& st : plane.stats) portable |= plane.stat_name(st) == sampling::kCpuStackTableStat;
    std::unordered_map<std::string, uint32_t> portable_nodes;  // key -> node index + 1
    auto portable_node_of = [&](uint32_t leaf) {
      std::vector<sampling::ModelFrame> frames = sampling::StackOfNode(plane, leaf);
      if (frames.empty()) {
        const model::EventMetadata& md = plane.event_metadata()[leaf];
        frames.push_back({md.display_name.empty() ? md.name : md.display_name, {}, 0, 0, false});
      }
      if (frames.size() > kMaxReportStackDepth) frames.resize(kMaxReportStackDepth);
      uint32_t caller = 0;  // node index + 1
      for (auto f = frames.rbegin(); f != frames.rend(); ++f) {
        std::string key = std::to_string(caller) + '\t' + std::string(f->function) + '\t' + std::string(f->file) +
                          '\t' + std::to_string(f->line) + (f->python ? "\tp" : "\tn");
        auto [it, added] = portable_nodes.emplace(std::move(key), static_cast<uint32_t>(set.node_fn.size()) + 1);
        if (added) {
          set.node_fn.push_back(str(f->function));
          set.node_file.push_back(str(f->file));
          set.node_line.push_back(f->line);
          set.node_kind.push_back(f->python ? 1 : 0);
          set.node_parent.push_back(caller);
        }
        caller = it->second;
      }
      index[leaf] = caller;
      return caller - 1;
    };
    auto node_of = [&](uint32_t leaf) {
      if (portable) return portable_node_of(leaf);
      pending.clear();
      for (uint32_t id = leaf; id != 0 && index[id] == 0 && pending.size() < kMaxReportStackDepth;) {
        uint32_t parent = 0;
        const sampling::ModelFrame f = sampling::FrameOfNode(plane, id, &parent);
        index[id] = static_cast<uint32_t>(set.node_fn.size()) + 1;
        pending.emplace_back(index[id] - 1, parent);
        set.node_fn.push_back(str(f.function));
        set.node_file.push_back(str(f.file));
        set.node_line.push_back(f.line);
        set.node_kind.push_back(f.python ? 1 : 0);
        set.node_parent.push_back(0);
        id = parent;
      }
      // Callers reached in this walk have their index now. (A hostile
      // model's cycle of callers stays a cycle: the page stops at
      // kMaxReportStackDepth frames.)
      for (auto [node, parent] : pending) set.node_parent[node] = parent != 0 ? index[parent] : 0;
      return index[leaf] - 1;
    };
    set.first_ns = samples.front().ns;
    int64_t previous = set.first_ns;
    set.encoded.reserve(samples.size() * 8);
    for (const Sample& s : samples) {
      const uint32_t node = index[s.leaf] != 0 ? index[s.leaf] - 1 : node_of(s.leaf);
      const int64_t gap = s.ns - previous;
      previous = s.ns;
      PutVarint(&set.encoded, (static_cast<uint64_t>(gap) << 1) ^ static_cast<uint64_t>(gap >> 63));
      PutVarint(&set.encoded, node);
      PutVarint(&set.encoded, s.thread);
      PutVarint(&set.encoded, static_cast<uint64_t>(std::max<int64_t>(s.cpu_ns, 0)));
    }
    set.samples = samples.size();
    out->push_back(std::move(set));
  }
  return Status::Ok();
}

}  // namespace spyglass::report
