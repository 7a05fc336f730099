#include "analysis/summary.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "common/saturate.h"
#include "common/utf8.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "sampling/cpu_model.h"
#include "spyglass/profile_reader.h"

namespace spyglass::analysis {
namespace {

// Names are kept capped: a name may be megabytes, and a hostile file would
// make every thread, row and table carry it (1 MiB of plane name over 1000
// threads was gigabytes). The first kMaxName bytes, cut at a character, and
// how many were left out; names of up to kMaxName bytes stay whole.
constexpr size_t kMaxName = 1024;
std::string ShownName(std::string_view name) {
  std::string_view kept = Utf8Prefix(name, kMaxName);  // the cut itself is never copied whole
  if (kept.size() == name.size()) return model::ValidUtf8(name);
  return model::ValidUtf8(kept) + CutNote(name.size() - kept.size());
}

using profile::EventRecord;
using profile::LineHeader;
using profile::PlaneHeader;
using profile::ProfileStat;

using model::kStepNumStat;

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// A step_num stat's value as a step number: false for NaN, infinities and
// values past int64 (converting those is undefined; they read as INT64_MIN).
bool StepNumber(double v, int64_t* out) {
  if (!(v >= -0x1p63 && v < 0x1p63)) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

// The p-th percentile of sorted values, interpolated between the closest
// ranks (numpy's default), so that numbers can be checked by hand.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double idx = p / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (idx - static_cast<double>(lo));
}

Distribution Distribute(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.count = v.size();
  for (double x : v) d.total_ns += x;
  d.mean_ns = d.total_ns / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - d.mean_ns) * (x - d.mean_ns);
  d.stddev_ns = v.size() > 1 ? std::sqrt(sq / static_cast<double>(v.size() - 1)) : 0;
  d.min_ns = v.front();
  d.max_ns = v.back();
  d.p50_ns = Percentile(v, 50);
  d.p90_ns = Percentile(v, 90);
  d.p99_ns = Percentile(v, 99);
  return d;
}

struct Agg {
  uint64_t count = 0;
  // total: an event inside an open one of the same name (recursion) is in
  // that one's time already and is not added again, so that a name's total
  // is at most its thread's busy time; calls: every event's duration, for
  // the mean per call.
  int64_t total_ps = 0, self_ps = 0, calls_ps = 0;  // saturating (hostile durations)
  void Add(const Agg& o) {
    count += o.count;
    total_ps = SaturatedAdd(total_ps, o.total_ps);
    self_ps = SaturatedAdd(self_ps, o.self_ps);
    calls_ps = SaturatedAdd(calls_ps, o.calls_ps);
  }
};

// Device lines with activity of their own: streams, XLA ops (not lines derived from them).
bool IsDeviceOpLine(std::string_view line) {
  return StartsWith(line, model::kStreamLinePrefix) || line == model::kXlaOpsLineName;
}
bool IsCopy(std::string_view name) {
  return StartsWith(name, model::kMemcpyEventPrefix) || StartsWith(name, model::kMemsetEventPrefix);
}

// Which events count: a window of steps (--step), else all.
struct Window {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [start, end) ps, sorted
  bool all = true;
  bool contains(int64_t ps) const {
    if (all) return true;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), std::pair{ps, INT64_MAX});
    return it != ranges.begin() && ps < std::prev(it)->second;
  }
};

class SummaryVisitor : public profile::ProfileVisitor {
 public:
  SummaryVisitor(const SummaryOptions& o, const Window& w, std::string host) : options_(o), window_(w), host_(host) {}

  // Only these lines' events, buffered and sorted (a second pass over lines
  // a writer left unsorted).
  std::vector<std::pair<size_t, size_t>> unsorted;  // (plane, line)
  void StartBufferedPass() {
    buffered_pass = true;
    plane_index_ = SIZE_MAX;
  }

  bool OnPlane(const PlaneHeader& p) override {
    ++plane_index_;
    plane_name_ = ShownName(p.name);
    device_ = StartsWith(p.name, model::kDevicePlanePrefix);
    metadata_ = p.name == model::kMetadataPlaneName;
    // Metadata ids are the plane's own.
    op_by_md_.clear();
    counter_by_md_.clear();
    steps_by_md_.clear();
    if (buffered_pass) return std::any_of(unsorted.begin(), unsorted.end(), [&](auto u) { return u.first == plane_index_; });
    ++planes;
    for (const ProfileStat& s : p.stats) {
      double v = 0;
      if (p.name == model::kTaskEnvPlaneName && s.as_double(&v)) {
        if (s.name == model::kProfileStartTimeStat) profile_start_ns = v;
        if (s.name == model::kProfileStopTimeStat) profile_stop_ns = v;
      }
      if (metadata_ && s.kind == ProfileStat::Kind::kString) {
        if (s.name == model::kVersionMetadata) producer = "spyglass " + std::string(s.str);
        else if (s.name == model::kJaxVersionMetadata && producer.empty()) producer = "jax " + std::string(s.str);
      }
      if (s.name.find("dropped") != std::string_view::npos && s.is_number() && s.as_double(&v))
        dropped.push_back({plane_name_, std::string(s.name), static_cast<uint64_t>(v)});
    }
    return !metadata_;
  }

  bool OnLine(const LineHeader& l) override {
    line_index_ = l.index;
    // CPU samples are not annotations: cpu_summary.h has their tables.
    if (l.name == sampling::kCpuSamplesLineName) {
      cpu_samples = true;
      return false;
    }
    if (buffered_pass) {
      bool want = std::find(unsorted.begin(), unsorted.end(), std::pair{plane_index_, l.index}) != unsorted.end();
      if (!want) return false;
    } else {
      ++lines;
    }
    counters_ = l.name == model::kCounterLineName;
    std::string name(l.display_name.empty() ? l.name : l.display_name);
    if (name.empty()) name = "thread " + std::to_string(l.id);
    if (!host_.empty()) name = host_ + " " + name;
    if (plane_name_ != model::kHostPlaneName && !device_) name += " (" + plane_name_ + ")";
    ops_ = device_ && IsDeviceOpLine(l.name);
    thread_ = !device_ && !counters_;
    if (thread_ && !options_.thread.empty() && name.find(options_.thread) == std::string::npos &&
        std::to_string(l.id) != options_.thread)
      thread_ = false;
    current_ = ThreadSummary{};
    current_.plane = plane_name_;
    current_.name = ShownName(name);
    current_.id = l.id;
    line_aggs_.clear();
    dense_aggs_.clear();
    stack_.clear();
    covered_end_ = INT64_MIN;
    busy_ps_ = 0;
    prev_start_ = INT64_MIN;
    prev_dur_ = 0;
    line_unsorted_ = false;
    buffer_.clear();
    return true;
  }

  void OnEvent(const EventRecord& e) override {
    if (!buffered_pass) {
      ++events;
      // Steps, anywhere: events with a step number.
      for (const ProfileStat& s : e.stats) {
        double v;
        if (s.name == kStepNumStat && s.as_double(&v)) {
          int64_t number;
          if (!StepNumber(v, &number)) ++bad_step_numbers;
          else if (e.duration_ps < 0) ++negative_steps;
          else
            StepsOf(e).push_back(
                {number, static_cast<double>(e.start_ps) / 1e3, static_cast<double>(e.duration_ps) / 1e3});
        }
        if (s.name == model::kIncompleteStat) ++incomplete;
      }
    }
    if (counters_) {
      Counter(e);
      return;
    }
    if (!window_.contains(e.start_ps)) return;
    // Hostile times: no negative duration, no end past int64's.
    const int64_t dur = std::clamp<int64_t>(e.duration_ps, 0, INT64_MAX - std::max<int64_t>(e.start_ps, 0));
    min_start_ps_ = std::min(min_start_ps_, e.start_ps);
    max_end_ps_ = std::max(max_end_ps_, e.start_ps + dur);
    if (ops_) {
      DeviceOp(e, dur);
      return;
    }
    if (!thread_) return;
    if (buffered_pass) {
      buffer_.push_back({e.start_ps, dur, e.metadata_id, e.name});
      return;
    }
    if (line_unsorted_) return;
    if (e.start_ps < prev_start_ || (e.start_ps == prev_start_ && dur > prev_dur_)) {
      line_unsorted_ = true;  // counted in a second pass, sorted
      unsorted.push_back({plane_index_, line_index_});
      return;
    }
    prev_start_ = e.start_ps;
    prev_dur_ = dur;
    Nest(e.start_ps, dur, e.metadata_id, e.name);
  }

  void OnSpace(const std::vector<std::string>& h, const std::vector<std::string>& e,
               const std::vector<std::string>& w) override {
    if (buffered_pass) return;
    for (auto [from, to] : {std::pair{&h, &hostnames}, std::pair{&e, &errors}, std::pair{&w, &warnings}})
      for (const std::string& x : *from) to->push_back(model::ValidUtf8(x));
  }

  void OnLineEnd() override {
    if (buffered_pass && thread_) {
      std::sort(buffer_.begin(), buffer_.end(), [](const Buffered& a, const Buffered& b) {
        return a.start != b.start ? a.start < b.start : a.dur > b.dur;
      });
      for (const Buffered& b : buffer_) Nest(b.start, b.dur, b.md, b.name);
      std::vector<Buffered>().swap(buffer_);
    }
    if (!thread_ || (line_unsorted_ && !buffered_pass)) return;
    while (!stack_.empty()) Pop();
    // Name strings once per line, not per event.
    auto add = [&](const LineAgg& la) {
      const Agg& a = la.agg;
      if (a.count == 0) return;
      std::string name = ShownName(la.name);
      current_aggs_[name].Add(a);
      all_aggs_[name].Add(a);
    };
    for (const LineAgg& la : dense_aggs_) add(la);
    for (const auto& [md, la] : line_aggs_) add(la);
    if (current_.events == 0 && current_aggs_.empty()) return;
    current_.busy_ns = static_cast<double>(busy_ps_) / 1e3;
    threads_.push_back({std::move(current_), std::move(current_aggs_)});
    current_aggs_.clear();
  }

  void Finish(Summary* out) {
    double wall_ns = profile_stop_ns > profile_start_ns && profile_start_ns > 0 ? profile_stop_ns - profile_start_ns : 0;
    if (min_start_ps_ <= max_end_ps_) {
      out->start_ns = static_cast<double>(min_start_ps_) / 1e3;
      out->end_ns = static_cast<double>(max_end_ps_) / 1e3;
      // Events may reach past the session's bounds (JAX's Python calls around start_trace).
      wall_ns = std::max(wall_ns, out->end_ns - out->start_ns);
    }
    if (!window_.all) {
      wall_ns = 0;
      for (auto [a, b] : window_.ranges) wall_ns += static_cast<double>(b - a) / 1e3;
    }
    out->wall_ns = wall_ns;
    auto share = [&](double ns) { return wall_ns > 0 ? ns / wall_ns : 0; };
    out->planes += planes, out->lines += lines, out->events += events;
    if (out->producer.empty()) out->producer = producer;
    auto rows = [&](const std::unordered_map<std::string, Agg>& aggs, const std::string& thread, bool by_self) {
      std::vector<AnnotationRow> v;
      v.reserve(aggs.size());
      for (const auto& [name, a] : aggs) {
        AnnotationRow r;
        r.name = name;
        r.thread = thread;
        r.count = a.count;
        r.total_ns = static_cast<double>(a.total_ps) / 1e3;
        r.self_ns = static_cast<double>(a.self_ps) / 1e3;
        r.mean_ns = a.count ? static_cast<double>(a.calls_ps) / 1e3 / static_cast<double>(a.count) : 0;
        r.share = share(r.total_ns);
        r.self_share = share(r.self_ns);
        v.push_back(std::move(r));
      }
      std::sort(v.begin(), v.end(), [by_self](const AnnotationRow& a, const AnnotationRow& b) {
        double x = by_self ? a.self_ns : a.total_ns, y = by_self ? b.self_ns : b.total_ns;
        return x != y ? x > y : a.name < b.name;
      });
      if (v.size() > Top()) v.resize(Top());
      return v;
    };
    out->top_total = rows(all_aggs_, "", false);
    out->top_self = rows(all_aggs_, "", true);
    for (auto& [t, aggs] : threads_) {
      t.busy_share = share(t.busy_ns);
      t.top_total = rows(aggs, t.name, false);
      t.top_self = rows(aggs, t.name, true);
      out->threads.push_back(std::move(t));
    }
    std::stable_sort(out->threads.begin(), out->threads.end(),
                     [](const ThreadSummary& a, const ThreadSummary& b) { return a.busy_ns > b.busy_ns; });
    auto ops = [&](const std::map<std::pair<std::string, std::string>, Agg>& m, const char* kind) {
      std::vector<DeviceOpRow> v;
      for (const auto& [key, a] : m) {
        DeviceOpRow r;
        r.device = key.first;
        r.name = key.second;
        r.kind = kind;
        r.count = a.count;
        r.total_ns = static_cast<double>(a.total_ps) / 1e3;
        r.mean_ns = a.count ? r.total_ns / static_cast<double>(a.count) : 0;
        r.share = share(r.total_ns);
        v.push_back(std::move(r));
      }
      std::sort(v.begin(), v.end(), [](const DeviceOpRow& a, const DeviceOpRow& b) {
        return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
      });
      if (v.size() > Top()) v.resize(Top());
      return v;
    };
    out->kernels = ops(kernels_, "kernel");
    out->copies = ops(copies_, "copy");
    for (auto& [key, c] : counters_map_) out->counters.push_back(c);
    for (auto& d : dropped) out->dropped.push_back(d);
    out->hostnames = hostnames, out->errors = errors, out->warnings = warnings;
    out->cpu_samples = cpu_samples;
    if (incomplete) out->dropped.push_back({"", "incomplete events (still open at stop)", incomplete});
    // Values no run can have: left out of the tables, and counted here.
    if (negative_steps) out->dropped.push_back({"", "steps with a negative duration (left out)", negative_steps});
    if (bad_step_numbers)
      out->dropped.push_back({"", "steps whose step_num is not an integer in range (left out)", bad_step_numbers});
    if (bad_counter_values)
      out->dropped.push_back({"", "counter samples that are not finite numbers (left out)", bad_counter_values});
    Steps(out);
  }

  std::string producer;
  double profile_start_ns = 0, profile_stop_ns = 0;
  uint64_t planes = 0, lines = 0, events = 0, incomplete = 0;
  uint64_t negative_steps = 0, bad_step_numbers = 0, bad_counter_values = 0;
  bool cpu_samples = false;
  std::vector<Summary::Dropped> dropped;
  std::vector<std::string> hostnames, errors, warnings;

 private:
  struct Open {
    int64_t start, end, dur, child_ps;
    uint64_t md;
    std::string_view name;  // points into the mapped file
  };
  struct LineAgg {
    Agg agg;
    std::string_view name;
    uint32_t open = 0;  // events of this name on the stack
  };
  struct Buffered {
    int64_t start, dur;
    uint64_t md;
    std::string_view name;
  };

  bool buffered_pass = false;

  size_t Top() const { return options_.top == 0 ? SIZE_MAX : options_.top; }

  void Nest(int64_t start, int64_t dur, uint64_t md, std::string_view name) {
    ++current_.events;
    int64_t end = start + dur;
    while (!stack_.empty() && stack_.back().end <= start) Pop();
    if (!stack_.empty()) {
      Open& parent = stack_.back();
      parent.child_ps = SaturatedAdd(parent.child_ps, SaturatedSub(std::min(end, parent.end), start));
    }
    // Busy: the union of all intervals (events start in order), so that an
    // event overlapping its parent's end (Python's calls around a TraceMe)
    // still counts.
    if (end > covered_end_) {
      busy_ps_ = SaturatedAdd(busy_ps_, SaturatedSub(end, std::max(start, covered_end_)));
      covered_end_ = end;
    }
    stack_.push_back({start, end, dur, 0, md, name});
    ++AggOf(md).open;
  }

  LineAgg& AggOf(uint64_t md) {
    if (md < kDenseIds) {
      if (md >= dense_aggs_.size()) dense_aggs_.resize(md + 1);
      return dense_aggs_[md];
    }
    return line_aggs_[md];
  }

  void Pop() {
    const Open& o = stack_.back();
    LineAgg& la = AggOf(o.md);
    la.name = o.name;
    Agg& a = la.agg;
    ++a.count;
    if (--la.open == 0) a.total_ps = SaturatedAdd(a.total_ps, o.dur);  // the outermost of its name (recursion: see Agg)
    a.calls_ps = SaturatedAdd(a.calls_ps, o.dur);
    a.self_ps = SaturatedAdd(a.self_ps, o.dur - std::min(o.child_ps, o.dur));
    stack_.pop_back();
  }

  // The name is made a key once per metadata id in a plane, not once per
  // event (a 1 MiB name on 20k events took 57 s).
  void DeviceOp(const EventRecord& e, int64_t dur) {
    Agg*& cached = op_by_md_[e.metadata_id];
    if (!cached) cached = &(IsCopy(e.name) ? copies_ : kernels_)[{plane_name_, ShownName(e.name)}];
    Agg& a = *cached;
    ++a.count;
    a.total_ps = SaturatedAdd(a.total_ps, dur);
  }

  void Counter(const EventRecord& e) {
    double v = 0;
    const ProfileStat* chosen = nullptr;
    for (const ProfileStat& s : e.stats)
      if ((s.name == model::kLiveBytesStat || !chosen) && s.as_double(&v)) chosen = &s;
    if (!chosen) return;
    chosen->as_double(&v);
    if (!std::isfinite(v)) {  // a NaN peak printed "nan B"
      ++bad_counter_values;
      return;
    }
    CounterPeak*& cached = counter_by_md_[e.metadata_id];
    if (!cached) {
      std::string name = ShownName(e.name);
      cached = &counters_map_[{plane_name_, name}];
      if (cached->samples == 0) cached->plane = plane_name_, cached->name = std::move(name);
    }
    CounterPeak& c = *cached;
    if (c.samples == 0 || v > c.peak) c.peak = v, c.peak_at_ns = static_cast<double>(e.start_ps) / 1e3;
    if (c.samples == 0) c.bytes = chosen->name.ends_with("bytes");
    ++c.samples;
    c.last = v;
  }

  std::vector<Step>& StepsOf(const EventRecord& e) {
    std::vector<Step>*& cached = steps_by_md_[e.metadata_id];
    if (!cached) cached = &steps_by_name_[ShownName(e.name)];
    return *cached;
  }

  void Steps(Summary* out) {
    // The most frequent step name's steps (moved: a long run has millions).
    size_t best = 0;
    std::vector<Step>* steps = nullptr;
    for (auto& [n, v] : steps_by_name_)
      if (v.size() > best) best = v.size(), out->steps.name = n, steps = &v;
    if (!steps) return;
    if (options_.step_first || options_.step_last) {
      std::erase_if(*steps, [&](const Step& s) {
        return (options_.step_first && s.number < *options_.step_first) ||
               (options_.step_last && s.number > *options_.step_last);
      });
    }
    // By start: each thread's steps come in order, so merge those runs.
    auto by_start = [](const Step& a, const Step& b) { return a.start_ns < b.start_ns; };
    std::vector<size_t> runs{0};
    for (size_t i = 1; i < steps->size(); ++i)
      if ((*steps)[i].start_ns < (*steps)[i - 1].start_ns) runs.push_back(i);
    runs.push_back(steps->size());
    while (runs.size() > 2) {
      std::vector<size_t> merged{0};
      for (size_t i = 0; i + 2 < runs.size(); i += 2) {
        std::inplace_merge(steps->begin() + static_cast<ptrdiff_t>(runs[i]),
                           steps->begin() + static_cast<ptrdiff_t>(runs[i + 1]),
                           steps->begin() + static_cast<ptrdiff_t>(runs[i + 2]), by_start);
        merged.push_back(runs[i + 2]);
      }
      if (runs.size() % 2 == 0) merged.push_back(runs.back());
      runs = std::move(merged);
    }
    std::vector<double> d;
    d.reserve(steps->size());
    for (const Step& s : *steps) d.push_back(s.duration_ns);
    out->steps.duration = Distribute(std::move(d));
    std::vector<size_t> order(steps->size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    size_t n = std::min(options_.slowest_steps, order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n), order.end(), [&](size_t a, size_t b) {
      return (*steps)[a].duration_ns != (*steps)[b].duration_ns ? (*steps)[a].duration_ns > (*steps)[b].duration_ns
                                                                : a < b;
    });
    for (size_t i = 0; i < n; ++i) out->steps.slowest.push_back((*steps)[order[i]]);
    out->steps.all = std::move(*steps);
    steps_by_name_.clear();
  }

  const SummaryOptions& options_;
  const Window& window_;
  std::string host_;
  size_t plane_index_ = SIZE_MAX, line_index_ = 0;
  std::string plane_name_;
  bool device_ = false, metadata_ = false, counters_ = false, ops_ = false, thread_ = false;
  // The current line.
  ThreadSummary current_;
  // By metadata id: a vector for the small dense ids writers assign.
  static constexpr uint64_t kDenseIds = 1 << 16;
  std::vector<LineAgg> dense_aggs_;
  std::unordered_map<uint64_t, LineAgg> line_aggs_;
  std::unordered_map<std::string, Agg> current_aggs_;
  std::vector<Open> stack_;
  std::vector<Buffered> buffer_;
  int64_t covered_end_ = INT64_MIN, busy_ps_ = 0, prev_start_ = INT64_MIN, prev_dur_ = 0;
  bool line_unsorted_ = false;
  // The whole profile.
  int64_t min_start_ps_ = INT64_MAX, max_end_ps_ = INT64_MIN;
  std::unordered_map<std::string, Agg> all_aggs_;
  std::vector<std::pair<ThreadSummary, std::unordered_map<std::string, Agg>>> threads_;
  std::map<std::pair<std::string, std::string>, Agg> kernels_, copies_;
  std::map<std::pair<std::string, std::string>, CounterPeak> counters_map_;
  std::map<std::string, std::vector<Step>> steps_by_name_;
  // The current plane's metadata ids -> the entries above (map nodes stay put).
  std::unordered_map<uint64_t, Agg*> op_by_md_;
  std::unordered_map<uint64_t, CounterPeak*> counter_by_md_;
  std::unordered_map<uint64_t, std::vector<Step>*> steps_by_md_;
};

// Finds the steps of a file (for --step) without the other tables.
class StepVisitor : public profile::ProfileVisitor {
 public:
  bool OnPlane(const PlaneHeader&) override {
    by_md_.clear();  // metadata ids are the plane's own
    return true;
  }
  void OnEvent(const EventRecord& e) override {
    for (const ProfileStat& s : e.stats) {
      double v;
      int64_t number;
      if (s.name == kStepNumStat && s.as_double(&v) && StepNumber(v, &number) && e.duration_ps >= 0) {
        auto*& cached = by_md_[e.metadata_id];
        if (!cached) cached = &steps[std::string(e.name)];  // the name copied once per id, not per step
        cached->push_back({number, e.start_ps, e.duration_ps});
      }
    }
  }
  struct S {
    int64_t number, start_ps, dur_ps;
  };
  std::map<std::string, std::vector<S>> steps;

 private:
  std::unordered_map<uint64_t, std::vector<S>*> by_md_;
};

}  // namespace

Status Summarize(const std::string& run, const SummaryOptions& options, Summary* out) {
  *out = Summary{};
  std::vector<std::string> files;
  if (Status s = profile::FindProfileFiles(run, &files); !s.ok()) return s;
  out->file = files.size() == 1 ? files[0] : run;
  // Progress over all files (and both passes when --step asks for two).
  bool step_pass = options.step_first || options.step_last;
  uint64_t done = 0, all = 0;
  profile::ReadOptions ro;
  ro.progress = [&](uint64_t n, uint64_t) {
    if (options.progress) options.progress(done + n, all);
  };
  // Each file read once (a reader holds its bytes), for every pass.
  std::vector<std::unique_ptr<profile::ProfileReader>> readers;
  uint64_t total = 0;
  for (const std::string& f : files) {
    auto r = std::make_unique<profile::ProfileReader>();
    if (Status s = r->Open(f, ro); !s.ok()) return s;
    total += r->size_bytes();
    readers.push_back(std::move(r));
  }
  out->file_bytes = total;
  all = total * (step_pass ? 2 : 1);
  Window window;
  if (step_pass) {
    window.all = false;
    for (auto& r : readers) {
      StepVisitor v;
      if (Status s = r->Scan(v); !s.ok()) return s;
      done += r->size_bytes();
      size_t best = 0;
      std::string name;
      for (const auto& [n, steps] : v.steps)
        if (steps.size() > best) best = steps.size(), name = n;
      if (!best) continue;
      for (const auto& s : v.steps[name])
        if ((!options.step_first || s.number >= *options.step_first) &&
            (!options.step_last || s.number <= *options.step_last))
          window.ranges.push_back({s.start_ps, SaturatedAdd(s.start_ps, s.dur_ps)});
    }
    std::sort(window.ranges.begin(), window.ranges.end());
  }
  std::vector<Summary> parts;
  for (auto& r : readers) {
    std::string host;
    if (files.size() > 1) {
      host = std::filesystem::path(r->path()).filename().string();
      host = host.substr(0, host.rfind(".xplane.pb"));
    }
    // Several files: every row, so that the hosts' tables can be summed.
    SummaryOptions per_file = options;
    if (files.size() > 1) per_file.top = 0;
    SummaryVisitor v(per_file, window, host);
    if (Status s = r->Scan(v); !s.ok()) return s;
    if (!v.unsorted.empty()) {
      v.StartBufferedPass();
      if (Status s = r->Scan(v); !s.ok()) return s;
    }
    done += r->size_bytes();
    r.reset();  // its bytes are no longer needed
    Summary one;
    v.Finish(&one);
    parts.push_back(std::move(one));
  }
  // The busiest threads only: a run with 300k threads is 300k rows and tables.
  auto top_threads = [&](Summary* s) {
    size_t top = options.top == 0 ? SIZE_MAX : options.top;
    if (s->threads.size() <= top) return;
    s->threads_left_out = s->threads.size() - top;
    s->threads.resize(top);
  };
  if (parts.size() == 1) {
    std::string file = out->file;
    *out = std::move(parts[0]);
    out->file = file;
    out->file_bytes = total;
    top_threads(out);
    return Status::Ok();
  }
  // Several hosts: their threads and counters side by side; the all-thread
  // tables and devices summed by name; the steps of the first file that has
  // them (each host runs the same steps).
  size_t main = 0;
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].steps.duration.count) {
      main = i;
      break;
    }
  std::string file = out->file;
  Summary merged = parts[main];
  merged.threads.clear(), merged.counters.clear(), merged.dropped.clear();
  merged.hostnames.clear(), merged.errors.clear(), merged.warnings.clear();
  merged.planes = merged.lines = merged.events = 0;
  for (Summary& p : parts) {
    merged.planes += p.planes, merged.lines += p.lines, merged.events += p.events;
    merged.cpu_samples = merged.cpu_samples || p.cpu_samples;
    for (auto pair : {std::pair{&p.hostnames, &merged.hostnames}, std::pair{&p.errors, &merged.errors},
                       std::pair{&p.warnings, &merged.warnings}})
      pair.second->insert(pair.second->end(), pair.first->begin(), pair.first->end());
    merged.threads.insert(merged.threads.end(), p.threads.begin(), p.threads.end());
    merged.counters.insert(merged.counters.end(), p.counters.begin(), p.counters.end());
    merged.dropped.insert(merged.dropped.end(), p.dropped.begin(), p.dropped.end());
  }
  for (Summary& p : parts) merged.wall_ns = std::max(merged.wall_ns, p.wall_ns);
  auto share = [&](double ns) { return merged.wall_ns > 0 ? ns / merged.wall_ns : 0; };
  size_t top = options.top == 0 ? SIZE_MAX : options.top;
  // The hosts' rows of one name summed.
  auto sum_rows = [&](std::vector<AnnotationRow> Summary::*table, bool by_self) {
    std::map<std::string, AnnotationRow> by_name;
    for (Summary& p : parts)
      for (const AnnotationRow& r : p.*table) {
        AnnotationRow& m = by_name[r.name];
        m.name = r.name;
        m.count += r.count, m.total_ns += r.total_ns, m.self_ns += r.self_ns;
        m.mean_ns += r.mean_ns * static_cast<double>(r.count);  // the calls' time: divided below
      }
    std::vector<AnnotationRow> v;
    for (auto& [name, r] : by_name) {
      r.mean_ns = r.count ? r.mean_ns / static_cast<double>(r.count) : 0;
      r.share = share(r.total_ns), r.self_share = share(r.self_ns);
      v.push_back(std::move(r));
    }
    std::sort(v.begin(), v.end(), [by_self](const AnnotationRow& a, const AnnotationRow& b) {
      double x = by_self ? a.self_ns : a.total_ns, y = by_self ? b.self_ns : b.total_ns;
      return x != y ? x > y : a.name < b.name;
    });
    if (v.size() > top) v.resize(top);
    merged.*table = std::move(v);
  };
  sum_rows(&Summary::top_total, false);
  sum_rows(&Summary::top_self, true);
  for (auto table : {&Summary::kernels, &Summary::copies}) {
    std::vector<DeviceOpRow> v;
    for (Summary& p : parts) v.insert(v.end(), (p.*table).begin(), (p.*table).end());
    std::sort(v.begin(), v.end(), [](const DeviceOpRow& a, const DeviceOpRow& b) {
      return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
    });
    if (v.size() > top) v.resize(top);
    for (DeviceOpRow& r : v) r.share = share(r.total_ns);
    merged.*table = std::move(v);
  }
  for (ThreadSummary& t : merged.threads) {
    t.busy_share = share(t.busy_ns);
    for (auto* rows : {&t.top_total, &t.top_self}) {
      if (rows->size() > top) rows->resize(top);
      for (AnnotationRow& r : *rows) r.share = share(r.total_ns), r.self_share = share(r.self_ns);
    }
  }
  std::stable_sort(merged.threads.begin(), merged.threads.end(),
                   [](const ThreadSummary& a, const ThreadSummary& b) { return a.busy_ns > b.busy_ns; });
  *out = std::move(merged);
  out->file = file;
  out->file_bytes = total;
  top_threads(out);
  return Status::Ok();
}

}  // namespace spyglass::analysis
