#include "analysis/cpu_summary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "analysis/json_writer.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "model/xspace_read.h"
#include "sampling/cpu_model.h"
#include "spyglass/profile_reader.h"

namespace spyglass::analysis {
namespace {

using Key = std::tuple<std::string, std::string, bool>;  // function, file, python

// The functions seen, as small ids shared by every scope (a stack is then
// a few integers, not strings to compare per frame and scope).
struct Functions {
  std::map<Key, uint32_t> ids;
  std::vector<const Key*> keys;
  std::vector<uint64_t> seen;  // by id: the Acc::Add call that last counted its total
  uint64_t call = 0;
  uint32_t Id(const sampling::ModelFrame& f) {
    auto [it, added] = ids.emplace(Key{std::string(f.function), std::string(f.file), f.python},
                                   static_cast<uint32_t>(keys.size()));
    if (added) {
      keys.push_back(&it->first);
      seen.push_back(0);
    }
    return it->second;
  }
};

struct Acc {
  uint64_t samples = 0;
  double cpu_ns = 0;
  std::unordered_map<uint32_t, CpuFunctionRow> rows;  // by function id
  // Samples of one plane by innermost node, added up before their stacks
  // are walked (AddPending): a stack is walked once per scope, not once per
  // sample.
  std::unordered_map<uint32_t, std::pair<uint64_t, double>> pending;
  void AddLeaf(uint32_t leaf, double ns) {
    auto& p = pending[leaf];
    ++p.first;
    p.second += ns;
  }
  template <class StackOf>
  void AddPending(StackOf&& stack_of, Functions& fns) {
    for (const auto& [leaf, p] : pending) Add(stack_of(leaf), p.second, p.first, fns);
    pending.clear();
  }
  // `frames`: function ids, innermost first.
  void Add(const std::vector<uint32_t>& frames, double ns, uint64_t count, Functions& fns) {
    samples += count;
    cpu_ns += ns;
    const uint64_t call = ++fns.call;
    for (size_t i = 0; i < frames.size(); ++i) {
      CpuFunctionRow& r = rows[frames[i]];
      if (i == 0) r.self_ns += ns;
      if (fns.seen[frames[i]] != call) {  // a recursive function's total counts once
        fns.seen[frames[i]] = call;
        r.total_ns += ns;
        r.samples += count;
      }
    }
  }
  CpuScope Finish(std::string name, size_t top, const Functions& fns) {
    CpuScope s;
    s.name = std::move(name);
    s.samples = samples;
    s.cpu_ns = cpu_ns;
    std::vector<std::pair<const Key*, CpuFunctionRow*>> by_key;
    for (auto& [id, r] : rows) by_key.emplace_back(fns.keys[id], &r);
    std::sort(by_key.begin(), by_key.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
    std::vector<CpuFunctionRow> all;
    for (auto& [k, r] : by_key) {
      r->function = std::get<0>(*k);
      r->file = std::get<1>(*k);
      r->python = std::get<2>(*k);
      r->self_share = cpu_ns > 0 ? r->self_ns / cpu_ns : 0;
      r->total_share = cpu_ns > 0 ? r->total_ns / cpu_ns : 0;
      all.push_back(*r);
    }
    auto pick = [&](double CpuFunctionRow::*by) {
      std::vector<CpuFunctionRow> v = all;
      std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return a.*by > b.*by; });
      v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& r) { return r.*by <= 0; }), v.end());
      if (top && v.size() > top) v.resize(top);
      return v;
    };
    s.top_self = pick(&CpuFunctionRow::self_ns);
    s.top_total = pick(&CpuFunctionRow::total_ns);
    return s;
  }
};

struct StepRange {
  int64_t start_ps, end_ps, number;
};

std::string Ms(double ns) {
  char buf[32];
  if (ns >= 1e9) std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  else std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  return buf;
}

std::string FunctionLabel(const CpuFunctionRow& r) {
  std::string file = r.file;
  if (size_t slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  std::string s = r.function;
  if (r.python && !file.empty()) s += " (" + file + ")";
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

void AppendScope(std::string* out, const CpuScope& s) {
  char line[256];
  std::snprintf(line, sizeof line, "CPU time in %s: %s in %llu samples\n", s.name.c_str(), Ms(s.cpu_ns).c_str(),
                static_cast<unsigned long long>(s.samples));
  *out += line;
  std::snprintf(line, sizeof line, "  %-60s %10s %7s %10s %7s\n", "function (top by self)", "self", "self %", "total",
                "total %");
  *out += line;
  for (const auto& r : s.top_self) {
    std::snprintf(line, sizeof line, "  %-60s %10s %6.1f%% %10s %6.1f%%\n", FunctionLabel(r).c_str(),
                  Ms(r.self_ns).c_str(), 100 * r.self_share, Ms(r.total_ns).c_str(), 100 * r.total_share);
    *out += line;
  }
  std::snprintf(line, sizeof line, "  %-60s %10s %7s\n", "function (top by total)", "total", "total %");
  *out += line;
  for (const auto& r : s.top_total) {
    std::snprintf(line, sizeof line, "  %-60s %10s %6.1f%%\n", FunctionLabel(r).c_str(), Ms(r.total_ns).c_str(),
                  100 * r.total_share);
    *out += line;
  }
  *out += "\n";
}

}  // namespace

Status SummarizeCpu(const std::string& run, size_t top, CpuSummary* out) {
  *out = CpuSummary{};
  std::vector<std::string> files;
  if (Status s = profile::FindProfileFiles(run, &files); !s.ok()) return s;
  Functions fns;
  Acc all;
  std::map<std::string, Acc> threads;
  std::map<int64_t, Acc> steps;
  for (const std::string& file : files) {
    model::Space space;
    if (Status s = model::ReadXSpaceFile(file, &space); !s.ok()) return s;
    for (const model::Plane& plane : space.planes) {
      if (plane.name.rfind(model::kHostPlaneName, 0) != 0) continue;
      // The steps: events with a step_num, on any line of the plane.
      std::vector<StepRange> ranges;
      for (const model::Line& line : plane.lines) {
        if (line.name == sampling::kCpuSamplesLineName) continue;
        for (const model::Event& e : line.events) {
          auto has_step = [&](std::span<const model::Stat> stats, int64_t* n) {
            for (const model::Stat& st : stats)
              if (plane.stat_name(st) == model::kStepNumStat) {
                *n = st.kind == model::StatKind::kUint64 ? static_cast<int64_t>(st.u64) : st.i64;
                return true;
              }
            return false;
          };
          int64_t n = 0;
          if (has_step(line.stats_of(e), &n) || has_step(plane.event_metadata()[e.metadata_id].stats, &n)) {
            const int64_t start = line.timestamp_ns * 1000 + e.offset_ps;
            ranges.push_back({start, start + e.duration_ps, n});
          }
        }
      }
      std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.start_ps < b.start_ps; });
      std::unordered_map<uint32_t, std::vector<uint32_t>> stacks;  // leaf -> function ids, innermost first
      for (const model::Line& line : plane.lines) {
        if (line.name != sampling::kCpuSamplesLineName) continue;
        std::string thread = line.display_name;
        if (size_t cut = thread.rfind(" CPU samples"); cut != std::string::npos) thread = thread.substr(0, cut);
        if (files.size() > 1) thread = file.substr(file.rfind('/') + 1) + " " + thread;
        Acc& t = threads[thread];
        for (const model::Event& e : line.events) {
          const double ns = static_cast<double>(e.duration_ps) / 1000;
          all.AddLeaf(e.metadata_id, ns);
          t.AddLeaf(e.metadata_id, ns);
          const int64_t at = line.timestamp_ns * 1000 + e.offset_ps;
          // The latest step started at or before the sample that is still open.
          auto r = std::upper_bound(ranges.begin(), ranges.end(), at,
                                    [](int64_t v, const StepRange& s) { return v < s.start_ps; });
          while (r != ranges.begin()) {
            --r;
            if (at < r->end_ps) {
              steps[r->number].AddLeaf(e.metadata_id, ns);
              break;
            }
            if (ranges.begin() + 8 < r) break;  // (only the few latest: steps do not nest deeply)
          }
        }
      }
      auto stack_of = [&](uint32_t leaf) -> const std::vector<uint32_t>& {
        auto it = stacks.find(leaf);
        if (it == stacks.end()) {
          std::vector<uint32_t> ids;
          for (const sampling::ModelFrame& f : sampling::StackOfNode(plane, leaf)) ids.push_back(fns.Id(f));
          it = stacks.emplace(leaf, std::move(ids)).first;
        }
        return it->second;
      };
      all.AddPending(stack_of, fns);
      for (auto& [name, acc] : threads) acc.AddPending(stack_of, fns);
      for (auto& [n, acc] : steps) acc.AddPending(stack_of, fns);
    }
  }
  out->samples = all.samples;
  out->cpu_ns = all.cpu_ns;
  out->all = all.Finish("all threads", top, fns);
  for (auto& [name, acc] : threads) out->threads.push_back(acc.Finish("thread " + name, top, fns));
  std::stable_sort(out->threads.begin(), out->threads.end(),
                   [](const CpuScope& a, const CpuScope& b) { return a.cpu_ns > b.cpu_ns; });
  for (auto& [n, acc] : steps) out->steps.push_back(acc.Finish("step " + std::to_string(n), top, fns));
  return Status::Ok();
}

void WriteCpuSummaryJson(JsonWriter& j, const CpuSummary& s) {
  auto rows = [&](const std::vector<CpuFunctionRow>& v) {
    j.begin_array();
    for (const CpuFunctionRow& r : v) {
      j.begin_object();
      j.field("function", r.function);
      j.field("file", r.file);
      j.field("python", r.python);
      j.field("samples", r.samples);
      j.field("self_ns", r.self_ns);
      j.field("total_ns", r.total_ns);
      j.field("self_share", r.self_share);
      j.field("total_share", r.total_share);
      j.end_object();
    }
    j.end_array();
  };
  auto scope = [&](const CpuScope& sc) {
    j.begin_object();
    j.field("name", sc.name);
    j.field("samples", sc.samples);
    j.field("cpu_ns", sc.cpu_ns);
    j.key("top_self");
    rows(sc.top_self);
    j.key("top_total");
    rows(sc.top_total);
    j.end_object();
  };
  j.begin_object();
  j.field("samples", s.samples);
  j.field("cpu_ns", s.cpu_ns);
  j.key("all");
  scope(s.all);
  for (auto [key, scopes] : {std::pair{"threads", &s.threads}, std::pair{"steps", &s.steps}}) {
    j.key(key);
    j.begin_array();
    for (const CpuScope& sc : *scopes) scope(sc);
    j.end_array();
  }
  j.end_object();
}

std::string CpuSummaryToText(const CpuSummary& s) {
  if (s.samples == 0) return "";
  std::string out = "\n";
  AppendScope(&out, s.all);
  for (const CpuScope& t : s.threads) AppendScope(&out, t);
  for (const CpuScope& t : s.steps) AppendScope(&out, t);
  return out;
}

std::vector<CpuDiffRow> CompareCpu(const CpuSummary& base, const CpuSummary& next, size_t top) {
  std::map<Key, CpuDiffRow> by_function;
  for (const auto& r : base.all.top_total) {
    CpuDiffRow& d = by_function[Key{r.function, r.file, r.python}];
    d.base_samples += r.samples;
    d.base_self_ns += r.self_ns, d.base_total_ns += r.total_ns;
    d.base_self_share += r.self_share, d.base_total_share += r.total_share;
  }
  for (const auto& r : next.all.top_total) {
    CpuDiffRow& d = by_function[Key{r.function, r.file, r.python}];
    d.new_samples += r.samples;
    d.new_self_ns += r.self_ns, d.new_total_ns += r.total_ns;
    d.new_self_share += r.self_share, d.new_total_share += r.total_share;
  }
  std::vector<CpuDiffRow> v;
  v.reserve(by_function.size());
  for (auto& [key, d] : by_function) {
    std::tie(d.function, d.file, d.python) = key;
    d.delta_self_ns = d.new_self_ns - d.base_self_ns;
    d.delta_total_ns = d.new_total_ns - d.base_total_ns;
    d.delta_self_share = d.new_self_share - d.base_self_share;
    d.delta_total_share = d.new_total_share - d.base_total_share;
    v.push_back(std::move(d));
  }
  // Shares, not times: the runs may be of different lengths.
  auto change = [](const CpuDiffRow& d) { return std::max(std::fabs(d.delta_self_share), std::fabs(d.delta_total_share)); };
  std::stable_sort(v.begin(), v.end(), [&](const CpuDiffRow& a, const CpuDiffRow& b) { return change(a) > change(b); });
  if (top && v.size() > top) v.resize(top);
  return v;
}

void WriteCpuDiffJson(JsonWriter& j, const CpuSummary& base, const CpuSummary& next,
                      const std::vector<CpuDiffRow>& rows) {
  j.begin_object();
  j.field("base_samples", base.samples);
  j.field("new_samples", next.samples);
  j.field("base_cpu_ns", base.cpu_ns);
  j.field("new_cpu_ns", next.cpu_ns);
  j.key("functions");
  j.begin_array();
  for (const CpuDiffRow& r : rows) {
    j.begin_object();
    j.field("function", r.function);
    j.field("file", r.file);
    j.field("python", r.python);
    j.field("base_samples", r.base_samples);
    j.field("new_samples", r.new_samples);
    j.field("base_self_ns", r.base_self_ns);
    j.field("new_self_ns", r.new_self_ns);
    j.field("delta_self_ns", r.delta_self_ns);
    j.field("base_total_ns", r.base_total_ns);
    j.field("new_total_ns", r.new_total_ns);
    j.field("delta_total_ns", r.delta_total_ns);
    j.field("base_self_share", r.base_self_share);
    j.field("new_self_share", r.new_self_share);
    j.field("delta_self_share", r.delta_self_share);
    j.field("base_total_share", r.base_total_share);
    j.field("new_total_share", r.new_total_share);
    j.field("delta_total_share", r.delta_total_share);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

std::string CpuDiffToText(const CpuSummary& base, const CpuSummary& next, size_t top) {
  return CpuDiffRowsToText(base, next, CompareCpu(base, next, top));
}

std::string CpuDiffRowsToText(const CpuSummary& base, const CpuSummary& next, const std::vector<CpuDiffRow>& v) {
  if (base.samples == 0 && next.samples == 0) return "";
  std::string out = "\nCPU time by function (share of each run's CPU time), biggest change first\n";
  char line[256];
  std::snprintf(line, sizeof line, "  base: %s in %llu samples; new: %s in %llu samples\n", Ms(base.cpu_ns).c_str(),
                static_cast<unsigned long long>(base.samples), Ms(next.cpu_ns).c_str(),
                static_cast<unsigned long long>(next.samples));
  out += line;
  std::snprintf(line, sizeof line, "  %-60s %8s %8s %8s %8s\n", "function", "self", "self", "total", "total");
  out += line;
  std::snprintf(line, sizeof line, "  %-60s %8s %8s %8s %8s\n", "", "base %", "new %", "base %", "new %");
  out += line;
  for (const CpuDiffRow& r : v) {
    CpuFunctionRow label;
    label.function = r.function, label.file = r.file, label.python = r.python;
    std::snprintf(line, sizeof line, "  %-60s %7.1f%% %7.1f%% %7.1f%% %7.1f%%\n", FunctionLabel(label).c_str(),
                  100 * r.base_self_share, 100 * r.new_self_share, 100 * r.base_total_share, 100 * r.new_total_share);
    out += line;
  }
  return out;
}

}  // namespace spyglass::analysis
