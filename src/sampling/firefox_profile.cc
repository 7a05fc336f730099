#include "sampling/firefox_profile.h"

#include <cinttypes>
#include <cstdio>
#include <map>
#include <string_view>
#include <unordered_map>

#include "model/schema.h"
#include "sampling/cpu_model.h"

namespace spyglass::sampling {
namespace {

constexpr int kCategoryOther = 0, kCategoryNative = 1, kCategoryPython = 2, kCategoryAnnotation = 3;

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A JSON array of the values.
template <typename T, typename F>
void AppendArray(std::string* out, const std::vector<T>& v, const F& each) {
  out->push_back('[');
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out->push_back(',');
    each(out, v[i]);
  }
  out->push_back(']');
}
void AppendInts(std::string* out, const std::vector<int64_t>& v) {
  AppendArray(out, v, [](std::string* o, int64_t x) {
    if (x < 0) *o += "null";  // "none" is null in the format's optional columns
    else *o += std::to_string(x);
  });
}

const model::Stat* FindStat(const model::Plane& plane, const std::vector<model::Stat>& stats, std::string_view key) {
  for (const model::Stat& s : stats)
    if (plane.stat_name(s) == key) return &s;
  return nullptr;
}

// One thread's tables.
struct Thread {
  std::vector<std::string> strings;
  std::unordered_map<std::string, int64_t> string_ids;
  // funcTable
  std::vector<int64_t> func_name, func_file, func_line;
  std::map<std::tuple<std::string, std::string, bool>, int64_t> func_ids;
  // frameTable
  std::vector<int64_t> frame_func, frame_line, frame_address, frame_category;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> frame_ids;
  // stackTable
  std::vector<int64_t> stack_frame, stack_prefix, stack_category;
  std::map<std::pair<int64_t, int64_t>, int64_t> stack_ids;
  std::unordered_map<uint32_t, int64_t> stack_of_node;
  // samples
  std::vector<int64_t> sample_stack;
  std::vector<double> sample_time_ms, sample_cpu_us;
  // markers
  std::vector<int64_t> marker_name;
  std::vector<double> marker_start, marker_end;

  int64_t Str(std::string_view s) {
    auto [it, fresh] = string_ids.emplace(std::string(s), static_cast<int64_t>(strings.size()));
    if (fresh) strings.emplace_back(s);
    return it->second;
  }
  // `stacks`: the plane's stacks read so far (shared by its threads).
  int64_t Stack(const model::Plane& plane, uint32_t leaf,
                std::unordered_map<uint32_t, std::vector<ModelFrame>>* stacks) {
    if (auto it = stack_of_node.find(leaf); it != stack_of_node.end()) return it->second;
    auto cached = stacks->find(leaf);
    if (cached == stacks->end()) cached = stacks->emplace(leaf, StackOfNode(plane, leaf)).first;
    const std::vector<ModelFrame>& frames = cached->second;  // innermost first
    int64_t prefix = -1;
    for (size_t k = frames.size(); k-- > 0;) {
      const ModelFrame& f = frames[k];
      const int category = f.python ? kCategoryPython : kCategoryNative;
      auto [fit, ffresh] = func_ids.emplace(std::make_tuple(std::string(f.function), std::string(f.file), f.python),
                                            static_cast<int64_t>(func_name.size()));
      if (ffresh) {
        func_name.push_back(Str(f.function));
        func_file.push_back(f.file.empty() ? -1 : Str(f.file));
        func_line.push_back(-1);
      }
      const int64_t address = f.python || f.address == 0 ? -1 : static_cast<int64_t>(f.address);
      auto [rit, rfresh] = frame_ids.emplace(std::make_tuple(fit->second, f.line > 0 ? f.line : -1, address),
                                             static_cast<int64_t>(frame_func.size()));
      if (rfresh) {
        frame_func.push_back(fit->second);
        frame_line.push_back(f.line > 0 ? f.line : -1);
        frame_address.push_back(address);
        frame_category.push_back(category);
      }
      auto [sit, sfresh] = stack_ids.emplace(std::make_pair(prefix, rit->second), static_cast<int64_t>(stack_frame.size()));
      if (sfresh) {
        stack_frame.push_back(rit->second);
        stack_prefix.push_back(prefix);
        stack_category.push_back(category);
      }
      prefix = sit->second;
    }
    stack_of_node.emplace(leaf, prefix);
    return prefix;
  }
};

void AppendThread(std::string* out, Thread& t, std::string_view name, bool main, std::string_view pid, int64_t tid,
                  std::string_view process_name) {
  *out += "{\"name\":";
  AppendJsonString(out, name);
  *out += ",\"isMainThread\":" + std::string(main ? "true" : "false");
  *out += ",\"processType\":\"default\",\"processName\":";
  AppendJsonString(out, process_name);
  *out += ",\"processStartupTime\":0,\"processShutdownTime\":null,\"registerTime\":0,\"unregisterTime\":null";
  *out += ",\"pausedRanges\":[],\"pid\":";
  AppendJsonString(out, pid);
  *out += ",\"tid\":" + std::to_string(tid);
  // samples
  const size_t n = t.sample_stack.size();
  *out += ",\"samples\":{\"length\":" + std::to_string(n) + ",\"weight\":null,\"weightType\":\"samples\",\"stack\":";
  AppendInts(out, t.sample_stack);
  *out += ",\"time\":";
  AppendArray(out, t.sample_time_ms, [](std::string* o, double x) { *o += Number(x); });
  *out += ",\"threadCPUDelta\":";
  AppendArray(out, t.sample_cpu_us, [](std::string* o, double x) { *o += Number(x); });
  *out += "}";
  // markers: intervals (phase 1), no payload
  const size_t m = t.marker_name.size();
  *out += ",\"markers\":{\"length\":" + std::to_string(m) + ",\"name\":";
  AppendInts(out, t.marker_name);
  *out += ",\"startTime\":";
  AppendArray(out, t.marker_start, [](std::string* o, double x) { *o += Number(x); });
  *out += ",\"endTime\":";
  AppendArray(out, t.marker_end, [](std::string* o, double x) { *o += Number(x); });
  *out += ",\"phase\":";
  AppendInts(out, std::vector<int64_t>(m, 1));
  *out += ",\"category\":";
  AppendInts(out, std::vector<int64_t>(m, kCategoryAnnotation));
  *out += ",\"data\":";
  AppendArray(out, std::vector<int64_t>(m, 0), [](std::string* o, int64_t) { *o += "null"; });
  *out += "}";
  // stackTable
  *out += ",\"stackTable\":{\"length\":" + std::to_string(t.stack_frame.size()) + ",\"frame\":";
  AppendInts(out, t.stack_frame);
  *out += ",\"prefix\":";
  AppendInts(out, t.stack_prefix);
  *out += ",\"category\":";
  AppendInts(out, t.stack_category);
  *out += ",\"subcategory\":";
  AppendInts(out, std::vector<int64_t>(t.stack_frame.size(), 0));
  *out += "}";
  // frameTable
  const size_t nf = t.frame_func.size();
  *out += ",\"frameTable\":{\"length\":" + std::to_string(nf) + ",\"address\":";
  AppendArray(out, t.frame_address, [](std::string* o, int64_t x) { *o += std::to_string(x); });  // -1: none
  *out += ",\"inlineDepth\":";
  AppendInts(out, std::vector<int64_t>(nf, 0));
  *out += ",\"category\":";
  AppendInts(out, t.frame_category);
  *out += ",\"subcategory\":";
  AppendInts(out, std::vector<int64_t>(nf, 0));
  *out += ",\"func\":";
  AppendInts(out, t.frame_func);
  const std::vector<int64_t> nulls(nf, -1);
  *out += ",\"nativeSymbol\":";
  AppendInts(out, nulls);
  *out += ",\"innerWindowID\":";
  AppendInts(out, nulls);
  *out += ",\"implementation\":";
  AppendInts(out, nulls);
  *out += ",\"line\":";
  AppendInts(out, t.frame_line);
  *out += ",\"column\":";
  AppendInts(out, nulls);
  *out += "}";
  // funcTable
  const size_t nfn = t.func_name.size();
  *out += ",\"funcTable\":{\"length\":" + std::to_string(nfn) + ",\"name\":";
  AppendInts(out, t.func_name);
  *out += ",\"isJS\":";
  AppendArray(out, std::vector<int64_t>(nfn, 0), [](std::string* o, int64_t) { *o += "false"; });
  *out += ",\"relevantForJS\":";
  AppendArray(out, std::vector<int64_t>(nfn, 0), [](std::string* o, int64_t) { *o += "false"; });
  *out += ",\"resource\":";
  AppendArray(out, std::vector<int64_t>(nfn, -1), [](std::string* o, int64_t x) { *o += std::to_string(x); });
  *out += ",\"fileName\":";
  AppendInts(out, t.func_file);
  *out += ",\"lineNumber\":";
  AppendInts(out, t.func_line);
  *out += ",\"columnNumber\":";
  AppendInts(out, std::vector<int64_t>(nfn, -1));
  *out += "}";
  *out += ",\"resourceTable\":{\"length\":0,\"lib\":[],\"name\":[],\"host\":[],\"type\":[]}";
  *out += ",\"nativeSymbols\":{\"length\":0,\"libIndex\":[],\"address\":[],\"name\":[],\"functionSize\":[]}";
  *out += ",\"stringArray\":";
  AppendArray(out, t.strings, [](std::string* o, const std::string& s) { AppendJsonString(o, s); });
  *out += "}";
}

}  // namespace

std::string FirefoxProfileJson(const model::Space& space, const model::Plane& host) {
  const model::Stat* period = FindStat(host, host.stats, kCpuSamplePeriodStat);
  if (period == nullptr) return "";
  const model::Stat* pid_stat = FindStat(host, host.stats, model::kProcessIdStat);
  const model::Stat* comm_stat = FindStat(host, host.stats, model::kProcessNameStat);
  const std::string pid = pid_stat ? host.stat_text(*pid_stat) : "0";
  const std::string comm = comm_stat ? host.stat_text(*comm_stat) : "process";
  double start_ms = 0;
  for (const model::Plane& p : space.planes)
    if (p.name == model::kTaskEnvPlaneName)
      if (const model::Stat* s = FindStat(p, p.stats, model::kProfileStartTimeStat))
        start_ms = static_cast<double>(s->kind == model::StatKind::kInt64 ? s->i64 : static_cast<int64_t>(s->u64)) / 1e6;

  std::map<int64_t, const model::Line*> annotation_lines;  // tid -> host line
  for (const model::Line& l : host.lines)
    if (l.name != kCpuSamplesLineName && l.id > 0 && l.id < kCpuSampleLineIdBase) annotation_lines[l.id] = &l;
  std::string threads;
  size_t thread_count = 0;
  std::unordered_map<uint32_t, std::vector<ModelFrame>> stacks;
  for (const model::Line& line : host.lines) {
    if (line.name != kCpuSamplesLineName) continue;
    const int64_t tid = line.id - kCpuSampleLineIdBase;
    Thread t;
    const double base_ms = static_cast<double>(line.timestamp_ns) / 1e6;
    for (const model::Event& e : line.events) {
      t.sample_stack.push_back(t.Stack(host, e.metadata_id, &stacks));
      t.sample_time_ms.push_back(base_ms + static_cast<double>(e.offset_ps) / 1e9);
      t.sample_cpu_us.push_back(static_cast<double>(e.duration_ps) / 1e6);
    }
    if (auto it = annotation_lines.find(tid); it != annotation_lines.end()) {
      const model::Line& al = *it->second;
      const double abase = static_cast<double>(al.timestamp_ns) / 1e6;
      for (const model::Event& e : al.events) {
        const model::EventMetadata& md = host.event_metadata()[e.metadata_id];
        t.marker_name.push_back(t.Str(md.display_name.empty() ? md.name : md.display_name));
        t.marker_start.push_back(abase + static_cast<double>(e.offset_ps) / 1e9);
        t.marker_end.push_back(abase + static_cast<double>(e.offset_ps + e.duration_ps) / 1e9);
      }
    }
    size_t cut = line.display_name.rfind(" CPU samples");
    std::string name = cut == std::string::npos ? line.display_name : line.display_name.substr(0, cut);
    if (thread_count++) threads.push_back(',');
    AppendThread(&threads, t, name, std::to_string(tid) == pid, pid, tid, comm);
  }
  if (thread_count == 0) return "";
  std::string out = "{\"meta\":{\"version\":24,\"preprocessedProfileVersion\":54,\"processType\":0,\"product\":";
  AppendJsonString(&out, "spyglass: " + comm);
  out += ",\"interval\":" + Number(static_cast<double>(period->u64) / 1e6);
  out += ",\"startTime\":" + Number(start_ms);
  out += ",\"symbolicated\":true,\"debug\":false,\"pausedRanges\":[],\"markerSchema\":[]";
  out += ",\"usesOnlyOneStackType\":true,\"sourceCodeIsNotOnSearchfox\":true";
  out += ",\"extensions\":{\"length\":0,\"baseURL\":[],\"id\":[],\"name\":[]}";
  out += ",\"sampleUnits\":{\"time\":\"ms\",\"eventDelay\":\"ms\",\"threadCPUDelta\":\"\\u00b5s\"}";
  out += ",\"categories\":[";
  const char* categories[][2] = {{"Other", "grey"}, {"Native", "blue"}, {"Python", "yellow"}, {"Annotation", "green"}};
  static_assert(kCategoryOther == 0 && kCategoryNative == 1 && kCategoryPython == 2 && kCategoryAnnotation == 3);
  for (size_t i = 0; i < 4; ++i) {
    if (i) out.push_back(',');
    out += "{\"name\":\"" + std::string(categories[i][0]) + "\",\"color\":\"" + categories[i][1] +
           "\",\"subcategories\":[\"Other\"]}";
  }
  out += "]},\"libs\":[],\"pages\":[],\"profilerOverhead\":[],\"counters\":[],\"threads\":[";
  out += threads;
  out += "]}";
  return out;
}

Status WriteFirefoxProfiles(const model::Space& space, const exporter::OutputDir& dir,
                            std::vector<std::string>* written) {
  for (const model::Plane& plane : space.planes) {
    if (plane.name.rfind(model::kHostPlaneName, 0) != 0) continue;
    std::string json = FirefoxProfileJson(space, plane);
    if (json.empty()) continue;
    // Not cpu.*: that prefix is the pprof profiles' (tools look for them by it).
    const std::string name = ProcessFileName(plane, "firefox", ".json");
    if (Status s = dir.WriteBytes(name, json); !s.ok()) return s;
    if (written) written->push_back(dir.PathOf(name));
  }
  return Status::Ok();
}

}  // namespace spyglass::sampling
