// The host tracer: runs the recorder behind TraceAnnotation (and the Python
// tracer, which records into it) for a session, and turns what it holds into
// the /host:CPU plane at stop.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "session/tracer.h"
#include "trace/clock.h"
#include "trace/host_collector.h"
#include "trace/recorder.h"

namespace spyglass::internal {
namespace {

uint64_t Bound(const profiler::ProfileOptions& o, const char* key, uint64_t fallback) {
  auto it = o.advanced_configuration.find(key);
  return it != o.advanced_configuration.end() && it->second.is_int() ? static_cast<uint64_t>(it->second.as_int())
                                                                     : fallback;
}

class HostTracer : public session::Tracer {
 public:
  HostTracer(int level, RecorderLimits limits) : level_(level), limits_(limits) {}
  Status Start() override {
    start_ticks_ = now_ticks();
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
    stats_ = CollectHostEvents(raw, start_ticks_, stop_ticks_, clock, &host);
    recorder_release(word_);
    std::sort(host.lines.begin(), host.lines.end(), [](const model::Line& a, const model::Line& b) {
      return (a.display_name.empty() ? a.name : a.display_name) < (b.display_name.empty() ? b.name : b.display_name);
    });
    host.stats.push_back(host.uint_stat("dropped_events", stats_.dropped));
    if (stats_.dropped > 0) {
      std::string w = "spyglass: " + std::to_string(stats_.dropped) +
                      " host events were dropped because the trace buffers were full (raise "
                      "buffer_bytes_per_thread / buffer_bytes_total)";
      space->warnings.push_back(w);
      std::fprintf(stderr, "%s\n", w.c_str());
    }
    return Status::Ok();
  }
  void AddStats(session::SessionSummary* summary) const override {
    summary->events += stats_.events;
    summary->dropped_events += stats_.dropped;
    summary->incomplete_events += stats_.incomplete;
    summary->threads += stats_.threads;
  }

 private:
  int level_;
  RecorderLimits limits_;
  uint64_t start_ticks_ = 0, stop_ticks_ = 0, word_ = 0;
  bool started_ = false, stopped_ = false;
  HostCollectStats stats_;
};

std::unique_ptr<session::Tracer> MakeHostTracer(const profiler::ProfileOptions& o) {
  if (o.host_tracer_level <= 0) return nullptr;
  RecorderLimits limits{Bound(o, "spyglass_buffer_bytes_per_thread", o.buffer_bytes_per_thread),
                        Bound(o, "spyglass_buffer_bytes_total", o.buffer_bytes_total)};
  return std::make_unique<HostTracer>(o.host_tracer_level, limits);
}

SPYGLASS_REGISTER_TRACER(host, session::kRankHost, MakeHostTracer);

}  // namespace
}  // namespace spyglass::internal
