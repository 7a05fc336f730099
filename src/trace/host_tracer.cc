// The host tracer: runs the recorder behind TraceAnnotation (and the Python
// tracer, which records into it) for a session, and turns what it holds into
// the /host:CPU plane at stop.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "session/flight_recorder.h"
#include "session/tracer.h"
#include "common/clock.h"
#include "trace/host_collector.h"
#include "trace/recorder.h"

namespace spyglass::internal {
namespace {

uint64_t Bound(const profiler::ProfileOptions& o, const char* key, uint64_t fallback) {
  auto it = o.advanced_configuration.find(key);
  return it != o.advanced_configuration.end() && it->second.is_int() ? static_cast<uint64_t>(it->second.as_int())
                                                                     : fallback;
}

// The host plane's drop and overwrite counts, and a warning for each.
void AddCounts(const HostCollectStats& stats, uint64_t since_ticks, model::Space* space) {
  model::Plane& host = space->plane(model::kHostPlaneName);
  host.stats.push_back(host.uint_stat(model::kDroppedEventsStat, stats.dropped));
  if (stats.dropped > 0) {
    std::string w = "spyglass: " + std::to_string(stats.dropped) +
                    " host events were dropped because the trace buffers were full (raise "
                    "buffer_bytes_per_thread / buffer_bytes_total)";
    space->warnings.push_back(w);
    std::fprintf(stderr, "%s\n", w.c_str());
  }
  if (since_ticks == 0) return;  // not a flight recorder
  host.stats.push_back(host.uint_stat(model::kOverwrittenEventsStat, stats.overwritten));
  // Overwritten events matter when they were inside the window asked for.
  if (stats.held_since_ticks > since_ticks) {
    std::string w = "spyglass: the flight recorder's ring could not hold the whole window: " +
                    std::to_string(stats.overwritten) +
                    " host events were overwritten so far (raise ring_buffer_bytes)";
    space->warnings.push_back(w);
    std::fprintf(stderr, "%s\n", w.c_str());
  }
}

class HostTracer : public session::Tracer {
 public:
  HostTracer(int level, RecorderLimits limits, uint64_t ring_seconds)
      : level_(level), limits_(limits), ring_seconds_(ring_seconds) {}
  Status Start() override {
    start_ticks_ = zero().ticks;
    word_ = recorder_start(level_, limits_);
    started_ = true;
    return Status::Ok();
  }
  Status Stop() override {
    if (!started_ || stopped_) return Status::Ok();
    recorder_stop();
    stop_ticks_ = now_ticks();
    stopped_ = true;
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    if (!stopped_) return Status::Ok();
    TickConverter clock = TickConverter::Calibrate();
    std::vector<RawThread> raw = recorder_collect(word_);
    model::Plane& host = space->plane(model::kHostPlaneName);
    // A flight recorder's run holds its last ring_seconds_, as a dump does.
    uint64_t since = ring_seconds_ > 0 ? WindowStart(clock, stop_ticks_) : 0;
    stats_ = CollectHostEvents(raw, since ? since : start_ticks_, stop_ticks_, clock, &host, since);
    recorder_release(word_);
    SortLines(&host);
    AddCounts(stats_, since, space);
    return Status::Ok();
  }
  Status Snapshot(model::Space* space, uint64_t since_ticks, uint64_t now_ticks) override {
    if (!started_ || stopped_ || ring_seconds_ == 0) return Status::Ok();
    TickConverter clock = TickConverter::Calibrate();
    std::vector<RawThread> raw = recorder_snapshot(word_, since_ticks);
    model::Plane& host = space->plane(model::kHostPlaneName);
    HostCollectStats stats = CollectHostEvents(raw, since_ticks, now_ticks, clock, &host, since_ticks);
    raw = {};
    SortLines(&host);
    AddCounts(stats, since_ticks, space);
    return Status::Ok();
  }
  void AddStats(session::SessionSummary* summary) const override {
    summary->events += stats_.events;
    summary->dropped_events += stats_.dropped;
    summary->incomplete_events += stats_.incomplete;
    summary->threads += stats_.threads;
  }

 private:
  static void SortLines(model::Plane* host) {
    std::sort(host->lines.begin(), host->lines.end(), [](const model::Line& a, const model::Line& b) {
      return (a.display_name.empty() ? a.name : a.display_name) < (b.display_name.empty() ? b.name : b.display_name);
    });
  }
  uint64_t WindowStart(const TickConverter& clock, uint64_t now) const {
    uint64_t span = static_cast<uint64_t>(static_cast<double>(ring_seconds_) * 1e9 / clock.ns_per_tick());
    return now - start_ticks_ > span ? now - span : start_ticks_;
  }

  int level_;
  RecorderLimits limits_;
  uint64_t ring_seconds_;
  uint64_t start_ticks_ = 0, stop_ticks_ = 0, word_ = 0;
  bool started_ = false, stopped_ = false;
  HostCollectStats stats_;
};

std::unique_ptr<session::Tracer> MakeHostTracer(const profiler::ProfileOptions& o) {
  if (o.host_tracer_level <= 0) return nullptr;
  RecorderLimits limits{Bound(o, "spyglass_buffer_bytes_per_thread", o.buffer_bytes_per_thread),
                        Bound(o, "spyglass_buffer_bytes_total", o.buffer_bytes_total)};
  session::FlightRecorderConfig ring;
  if (session::ResolveFlightRecorder(o, &ring).ok() && ring.seconds > 0) {
    // The ring's budget bounds all buffers; one thread may use all of it.
    limits = {std::min(limits.bytes_per_thread, ring.bytes), ring.bytes, true};
  }
  return std::make_unique<HostTracer>(o.host_tracer_level, limits, ring.seconds);
}

SPYGLASS_REGISTER_TRACER(host, session::kRankHost, MakeHostTracer);

}  // namespace
}  // namespace spyglass::internal
