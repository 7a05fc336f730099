// The memory tracer: while a trace session runs, every tracked allocation and
// free is appended (timestamp, device/kind, +-bytes) to a bounded lock-free
// buffer (memory/tracker.cc); at stop it becomes a per-device live-bytes
// counter: events "memory <device>" with the stat live_bytes on a line named
// "_counters_" of the /host:CPU plane (the XSpace counter-line convention;
// the trace JSON exporter writes them as "ph":"C" counter events).
#include <algorithm>
#include <cstdio>
#include <map>

#include <time.h>

#include "memory/timeline.h"
#include "memory/tracker.h"
#include "model/xspace.h"
#include "session/tracer.h"
#include "spyglass/internal/recorder.h"
#include "spyglass/profiler.h"
#include "common/clock.h"

namespace spyglass::memory {
namespace {

using namespace internal;  // NOLINT

constexpr uint64_t kMaxOutputSamples = 500000;  // per session, all devices

class MemoryTracer : public session::Tracer {
 public:
  explicit MemoryTracer(uint64_t capacity) : capacity_(capacity) {}
  Status Start() override {
    ScopedUntracked untracked;
    base_ = LiveBytesByClass();
    start_mono_ns_ = MonotonicNs();
    start_ticks_ = zero().ticks;
    started_ = CounterStart(capacity_);
    return Status::Ok();
  }
  Status Stop() override {
    if (!started_) return Status::Ok();
    TimelineSampleNow();  // the series' last point, inside the session
    stop_ticks_ = spyglass::internal::now_ticks();
    stop_mono_ns_ = MonotonicNs();
    CounterStop(&events_, &n_, &dropped_);
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    if (!started_) return Status::Ok();
    ScopedUntracked untracked;
    spyglass::internal::TickConverter clock = spyglass::internal::TickConverter::Calibrate();
    struct Ev {
      uint64_t ticks;
      int64_t delta;
      uint32_t cls;
    };
    std::vector<Ev> evs;
    evs.reserve(n_);
    for (uint64_t i = 0; i < n_; ++i) {
      uint64_t t = __atomic_load_n(&events_[i].ticks, __ATOMIC_ACQUIRE);
      if (t == 0 || t < start_ticks_) continue;  // unfinished, or a straggler from before
      int64_t v = __atomic_load_n(&events_[i].delta_and_class, __ATOMIC_RELAXED);
      evs.push_back({t, v >> 8, static_cast<uint32_t>(v & 0xff)});
    }
    CounterRelease();
    std::sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.ticks < b.ticks; });
    // Per device (kinds summed).
    std::map<std::string, int64_t> live;
    std::vector<std::string> device_of(kMaxClasses + 1);
    for (uint32_t c = 1; c <= ClassCount(); ++c) device_of[c] = std::string(ClassDevice(c));
    std::map<std::string, bool> active;
    for (uint32_t c = 1; c < base_.size(); ++c)
      if (base_[c] != 0) {
        live[device_of[c]] += base_[c];
        active[device_of[c]] = true;
      }
    for (const Ev& e : evs) active[device_of[e.cls]] = true;
    if (active.empty() && dropped_ == 0) return Status::Ok();

    model::Plane& host = space->plane(model::kHostPlaneName);
    model::Line& line = host.line_with_id(INT64_MAX);
    line.name = line.display_name = std::string(model::kCounterLineName);
    line.timestamp_ns = 0;
    auto to_ps = [&](uint64_t t) { return t <= start_ticks_ ? int64_t{0} : clock.ns_between(start_ticks_, t) * 1000; };
    int64_t end_ps = to_ps(stop_ticks_);
    std::map<std::string, uint32_t> md;
    for (const auto& [dev, on] : active) md[dev] = host.intern_event("memory " + dev);
    auto emit = [&](const std::string& dev, int64_t ps, int64_t value) {
      model::Event e;
      e.offset_ps = ps;
      e.metadata_id = md[dev];
      line.add_stat(e, host.int_stat(model::kLiveBytesStat, value));
      line.events.push_back(e);
    };
    for (const auto& [dev, on] : active) emit(dev, 0, live[dev]);
    // Coalesce: per device and grid step at most two samples, the step's peak
    // and its last value (peaks are what memory tracks are read for).
    int64_t grid_ps = std::max<int64_t>(
        1000000, end_ps / static_cast<int64_t>(kMaxOutputSamples / 2 / std::max<size_t>(1, active.size())));
    struct Pending {
      int64_t slot = -1, peak_ps = 0, peak = 0, last_ps = 0, last = 0;
    };
    auto flush = [&](const std::string& dev, const Pending& p) {
      if (p.slot < 0) return;
      emit(dev, p.peak_ps, p.peak);
      if (p.last_ps != p.peak_ps || p.last != p.peak) emit(dev, std::max(p.last_ps, p.peak_ps), p.last);
    };
    std::map<std::string, Pending> pending;
    // A full buffer drops the later events, and a running sum of the kept
    // deltas would stop (or stray) at the drop. Past the last kept event the
    // track is drawn from the memory timeline instead, which loses nothing:
    // each of its points holds the live bytes then and the highest value
    // since the previous point (timeline.h).
    const uint64_t reduced_after = dropped_ > 0 && !evs.empty() ? evs.back().ticks : (dropped_ > 0 ? start_ticks_ : 0);
    for (const Ev& ev : evs) {
      const std::string& dev = device_of[ev.cls];
      int64_t v = live[dev] += ev.delta;
      int64_t ps = to_ps(ev.ticks);
      Pending& p = pending[dev];
      if (p.slot != ps / grid_ps) {
        flush(dev, p);
        p = {ps / grid_ps, ps, v, ps, v};
      } else {
        if (v > p.peak) p.peak_ps = ps, p.peak = v;
        p.last_ps = ps, p.last = v;
      }
    }
    for (const auto& [dev, p] : pending) flush(dev, p);
    Timeline timeline = CurrentTimeline(/*symbolize=*/false);
    uint64_t reduced_points = 0;
    if (dropped_ > 0) reduced_points = AddTimelinePeaks(timeline, to_ps(reduced_after), end_ps, md, emit, &live);
    for (const auto& [dev, on] : active) emit(dev, end_ps, live[dev]);
    AddSiteCounters(host, line);
    line.sort_events();
    host.stats.push_back(host.uint_stat("memory_counter_events_dropped", dropped_));
    host.stats.push_back(host.uint_stat("memory_counter_reduced_points", reduced_points));
    if (dropped_ > 0) {
      std::string w = "spyglass: the memory counter's buffer filled at " + std::to_string(to_ps(reduced_after) / 1000000000) +
                      " ms (" + std::to_string(dropped_) + " samples past it); from there the live-bytes track is " +
                      std::to_string(reduced_points) + " points of the memory timeline, each the peak and the last value of its interval (" +
                      std::to_string(timeline.interval_ns / 1000000) + " ms apart)";
      space->warnings.push_back(w);
      std::fprintf(stderr, "%s\n", w.c_str());
    }
    return Status::Ok();
  }

 private:
  static int64_t MonotonicNs() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  }

  // The track past the last kept event (from_ps), from the timeline's points
  // within the session: per point, its interval's peak midway, then its live
  // value. `live` ends at the last point's values. Returns the points used.
  template <typename Emit>
  uint64_t AddTimelinePeaks(const Timeline& t, int64_t from_ps, int64_t end_ps,
                            const std::map<std::string, uint32_t>& devices, Emit& emit,
                            std::map<std::string, int64_t>* live) const {
    uint64_t used = 0;
    int64_t prev_ps = from_ps;
    for (const TimelinePoint& p : t.points) {
      // Points are in CLOCK_MONOTONIC: within the session by that clock (the
      // last one was taken at Stop), placed on the track's clock.
      const int64_t ns = t.start_monotonic_ns + p.t_ns - start_mono_ns_;
      const int64_t ps = ns * 1000;
      if (ps <= from_ps || ns > stop_mono_ns_ - start_mono_ns_) continue;
      const int64_t at = std::min(ps, end_ps);
      for (size_t d = 0; d < t.devices.size() && d < p.live.size() && d < p.max.size(); ++d) {
        if (!devices.count(t.devices[d])) continue;
        if (p.max[d] > p.live[d]) emit(t.devices[d], prev_ps + (at - prev_ps) / 2, p.max[d]);
        emit(t.devices[d], at, p.live[d]);
        (*live)[t.devices[d]] = p.live[d];
      }
      prev_ps = at;
      ++used;
    }
    return used;
  }

  // The top call sites over time (memory/timeline.h) within the session, one
  // counter each ("memory <device> <stack>"), sites with the same named stack
  // summed; the kTimelineTopSites that held most.
  void AddSiteCounters(model::Plane& host, model::Line& line) {
    Timeline t = CurrentTimeline(true);
    std::map<uint32_t, std::string> name_of;
    for (const TimelineSite& s : t.sites)
      name_of[s.id] = "memory " + s.device + " " + (s.stack.empty() ? std::string("(no stack)") : s.stack);
    struct Sample {
      int64_t ps;
      std::map<std::string, int64_t> bytes;
    };
    std::vector<Sample> samples;
    std::map<std::string, int64_t> most;
    const int64_t end_ns = stop_mono_ns_ - start_mono_ns_;
    for (const TimelinePoint& p : t.points) {
      int64_t ns = t.start_monotonic_ns + p.t_ns - start_mono_ns_;
      if (ns < 0 || ns > end_ns) continue;
      Sample smp{ns * 1000, {}};
      for (const auto& [id, b] : p.sites)
        if (auto it = name_of.find(id); it != name_of.end()) smp.bytes[it->second] += b;
      for (const auto& [n, b] : smp.bytes) most[n] = std::max(most[n], b);
      samples.push_back(std::move(smp));
    }
    std::vector<std::pair<int64_t, std::string>> order;
    for (const auto& [n, b] : most) order.push_back({b, n});
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (order.size() > static_cast<size_t>(kTimelineTopSites)) order.resize(kTimelineTopSites);
    for (const auto& [b, n] : order) {
      uint32_t md = host.intern_event(n);
      for (const Sample& smp : samples) {
        auto it = smp.bytes.find(n);
        model::Event e;
        e.offset_ps = smp.ps;
        e.metadata_id = md;
        // Not among that point's top sites: 0 on the track (the chart's blank).
        line.add_stat(e, host.int_stat(model::kLiveBytesStat, it == smp.bytes.end() ? 0 : it->second));
        line.events.push_back(e);
      }
    }
  }

  uint64_t capacity_;
  int64_t start_mono_ns_ = 0, stop_mono_ns_ = 0;
  std::vector<int64_t> base_;
  uint64_t start_ticks_ = 0, stop_ticks_ = 0;
  bool started_ = false;
  const CounterEvent* events_ = nullptr;
  uint64_t n_ = 0, dropped_ = 0;
};

std::unique_ptr<session::Tracer> MakeMemoryTracer(const profiler::ProfileOptions& o) {
  uint64_t bytes = o.buffer_bytes_total ? o.buffer_bytes_total / 8 : (64ull << 20);
  return std::make_unique<MemoryTracer>(std::max<uint64_t>(1024, bytes / sizeof(CounterEvent)));
}

SPYGLASS_REGISTER_TRACER(memory_timeline, session::kRankMemoryTimeline, MakeMemoryTracer);

}  // namespace
}  // namespace spyglass::memory
