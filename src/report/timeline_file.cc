// Reading a profile file into the report's timeline (timeline.h): every
// line through the public streaming reader, in bounded memory.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>

#include "model/schema.h"
#include "report/timeline.h"
#include "spyglass/profile_reader.h"

namespace spyglass::report {
namespace {

// Feeds each line of a profile to the timeline; counter lines become
// counter tracks (one per event name, its live_bytes or first number, as
// the summary's counter peaks).
class TimelineVisitor : public profile::ProfileVisitor {
 public:
  TimelineVisitor(TimelineBuilder* b, std::string host, uint64_t* sample_lines,
                  const std::set<std::pair<size_t, size_t>>* unsorted)
      : b_(b), host_(std::move(host)), host_hash_(host_.empty() ? 0 : std::hash<std::string>{}(host_)),
        sample_lines_(sample_lines), unsorted_(unsorted) {}
  bool OnPlane(const profile::PlaneHeader& p) override {
    plane_ = host_.empty() ? std::string(p.name) : host_ + " " + std::string(p.name);
    ++plane_index_;
    return true;
  }
  bool OnLine(const profile::LineHeader& l) override {
    samples_ = l.name == kCpuSamplesLine;
    if (sample_lines_ != nullptr && samples_) {
      ++*sample_lines_;
      return false;
    }
    counters_ = l.name == model::kCounterLineName;
    if (counters_) return true;
    std::string name(l.display_name.empty() ? l.name : l.display_name);
    const bool sorted = unsorted_ != nullptr && !unsorted_->contains({plane_index_ - 1, l.index});
    b_->BeginLine(plane_, name.empty() ? "line " + std::to_string(l.id) : name, l.id, sorted);
    return true;
  }
  void OnEvent(const profile::EventRecord& e) override {
    if (!counters_) {
      // A sample's node is named cpu_stack#<n>; its display name is its
      // function, as the report names samples (report/cpu_samples.cc).
      std::string_view name = samples_ && !e.display_name.empty() ? e.display_name : e.name;
      // Most events carry no id: one look at their stats' names skips the three searches.
      bool ids = false;
      for (const profile::ProfileStat& s : e.stats)
        if (!s.name.empty() && (s.name[0] == '_' || s.name == model::kCorrelationIdStat)) ids = true;
      if (!ids) {
        b_->AddEvent(name, e.start_ps, e.duration_ps, Detail(e));
        return;
      }
      b_->AddEvent(name, e.start_ps, e.duration_ps, Detail(e), Flow(e), AsyncFlow(e, "_c", "_ct"),
                   AsyncFlow(e, "_p", "_pt"));
      return;
    }
    const profile::ProfileStat* chosen = nullptr;
    double v = 0;
    for (const profile::ProfileStat& s : e.stats)
      if ((s.name == model::kLiveBytesStat || !chosen) && s.as_double(&v)) chosen = &s;
    if (chosen == nullptr) return;
    chosen->as_double(&v);
    b_->AddCounterSample(plane_, e.name, e.start_ps, v, chosen->name.ends_with("bytes"));
  }
  void OnLineEnd() override {
    if (!counters_) b_->EndLine();
  }

 private:
  // The event's own stats as "name=value, ...", for the tooltip; ids that
  // differ on every event (correlation, group, XProf's "_" internals) left
  // out: they would make every detail string distinct.
  std::string_view Detail(const profile::EventRecord& e) {
    detail_.clear();
    for (const profile::ProfileStat& s : e.stats) {
      if (s.name.empty() || s.name[0] == '_' || s.name == model::kCorrelationIdStat || s.name == "group_id" ||
          s.kind == profile::ProfileStat::Kind::kBytes)
        continue;
      if (detail_.size() >= kMaxDetailLength) break;
      if (!detail_.empty()) detail_ += ", ";
      detail_.append(s.name).push_back('=');
      char buf[32];
      if (s.kind == profile::ProfileStat::Kind::kString) detail_.append(s.str.substr(0, kMaxDetailLength));
      else if (s.kind == profile::ProfileStat::Kind::kDouble) detail_.append(buf, std::snprintf(buf, sizeof buf, "%.6g", s.f64));
      else if (s.kind == profile::ProfileStat::Kind::kUint64) detail_ += std::to_string(s.u64);
      else detail_ += std::to_string(s.i64);
    }
    return detail_;
  }
  // The correlation id that ties a launch to its kernel (ids of several
  // hosts' files kept apart).
  uint64_t Flow(const profile::EventRecord& e) const {
    for (const profile::ProfileStat& s : e.stats) {
      if (s.name != model::kCorrelationIdStat) continue;
      uint64_t id = s.kind == profile::ProfileStat::Kind::kUint64  ? s.u64
                    : s.kind == profile::ProfileStat::Kind::kInt64 ? static_cast<uint64_t>(s.i64)
                                                                   : 0;
      if (id == 0) return 0;
      uint64_t flow = id ^ host_hash_;
      return flow != 0 ? flow : 1;
    }
    return 0;
  }
  // An async pair (a producer and its consumers, XProf's "_p"/"_pt" and
  // "_c"/"_ct": a prefetch and where it is consumed, on other threads) by
  // its type and id; kept apart from correlation ids and from other hosts'.
  uint64_t AsyncFlow(const profile::EventRecord& e, std::string_view id_stat, std::string_view type_stat) const {
    uint64_t id = 0, type = 0;
    bool has_id = false;
    for (const profile::ProfileStat& s : e.stats) {
      if (s.name != id_stat && s.name != type_stat) continue;
      uint64_t v = s.kind == profile::ProfileStat::Kind::kUint64  ? s.u64
                   : s.kind == profile::ProfileStat::Kind::kInt64 ? static_cast<uint64_t>(s.i64)
                                                                  : 0;
      if (s.name == id_stat) id = v, has_id = true;
      else type = v;
    }
    if (!has_id) return 0;
    // splitmix64 of (type, id): spread over 64 bits, the top one set (correlation ids are small).
    uint64_t z = id + 0x9e3779b97f4a7c15ull * (type + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z ^ host_hash_) | (uint64_t{1} << 63);
  }
  std::string detail_;
  TimelineBuilder* b_;
  std::string host_, plane_;
  uint64_t host_hash_;
  uint64_t* sample_lines_;
  bool counters_ = false;
  bool samples_ = false;  // the line is a thread's CPU samples
  static constexpr std::string_view kCpuSamplesLine = "CPU samples";  // sampling/cpu_model.h
  const std::set<std::pair<size_t, size_t>>* unsorted_;
  size_t plane_index_ = 0;
};

// Which lines' events come out of TimelineBuilder's order (by start, the
// longest first at one start; durations clamped as AddEvent does).
class OrderVisitor : public profile::ProfileVisitor {
 public:
  explicit OrderVisitor(std::set<std::pair<size_t, size_t>>* unsorted) : unsorted_(unsorted) {}
  bool OnPlane(const profile::PlaneHeader&) override {
    ++plane_index_;
    return true;
  }
  bool OnLine(const profile::LineHeader& l) override {
    line_ = l.index;
    first_ = true;
    in_order_ = true;
    return l.name != model::kCounterLineName;
  }
  void OnEvent(const profile::EventRecord& e) override {
    if (!in_order_) return;
    const int64_t start = e.start_ps;
    const int64_t end = start + std::clamp<int64_t>(e.duration_ps, 0, INT64_MAX - std::max<int64_t>(start, 0));
    if (!first_ && (start < start_ || (start == start_ && end > end_))) {
      in_order_ = false;
      unsorted_->insert({plane_index_ - 1, line_});
    }
    first_ = false;
    start_ = start;
    end_ = end;
  }

 private:
  std::set<std::pair<size_t, size_t>>* unsorted_;
  size_t plane_index_ = 0, line_ = 0;
  bool first_ = true, in_order_ = true;
  int64_t start_ = 0, end_ = 0;
};

}  // namespace

Status FindUnsortedLines(const std::string& path, std::set<std::pair<size_t, size_t>>* unsorted) {
  profile::ProfileReader reader;
  OrderVisitor visitor(unsorted);
  Status s = reader.Open(path);
  if (s.ok()) s = reader.Scan(visitor);
  return s;
}

Status AddProfileFile(const std::string& path, const std::string& host, TimelineBuilder* builder,
                      uint64_t* sample_lines, const std::set<std::pair<size_t, size_t>>* unsorted,
                      const std::function<void(uint64_t, uint64_t)>& progress) {
  profile::ProfileReader reader;
  TimelineVisitor visitor(builder, host, sample_lines, unsorted);
  profile::ReadOptions options;
  options.progress = progress;
  Status s = reader.Open(path, options);
  if (s.ok()) s = reader.Scan(visitor);
  return s;
}

}  // namespace spyglass::report
