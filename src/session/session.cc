#include "session/session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <sstream>
#include <thread>

#include "trace/clock.h"
#include "trace/host_collector.h"
#include "trace/recorder.h"

namespace spyglass {
const char* version() { return SPYGLASS_VERSION; }
}  // namespace spyglass

namespace spyglass::session {
namespace {

std::atomic<bool> g_session_active{false};

std::mutex& factories_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::vector<TracerFactory>& factories() {
  static auto* f = new std::vector<TracerFactory>;
  return *f;
}

std::mutex& metadata_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::map<std::string, std::string>& metadata() {
  static auto* m = new std::map<std::string, std::string>;
  return *m;
}

std::mutex& process_name_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::string& process_name() {
  static auto* n = new std::string;
  return *n;
}

std::string CommandLine() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  return raw;
}

uint64_t Bound(const profiler::ProfileOptions& o, const char* key, uint64_t fallback) {
  auto it = o.advanced_configuration.find(key);
  return it != o.advanced_configuration.end() && it->second.is_int() ? static_cast<uint64_t>(it->second.as_int())
                                                                     : fallback;
}

// The host tracer: the recorder behind TraceAnnotation.
class HostTracer : public Tracer {
 public:
  HostTracer(int level, internal::RecorderLimits limits) : level_(level), limits_(limits) {}
  Status Start() override {
    start_ticks_ = internal::now_ticks();
    word_ = internal::recorder_start(level_, limits_);
    return Status::Ok();
  }
  Status Stop() override {
    internal::recorder_stop();
    stop_ticks_ = internal::now_ticks();
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    internal::TickConverter clock = internal::TickConverter::Calibrate();
    std::vector<internal::RawThread> raw = internal::recorder_collect(word_);
    model::Plane& host = space->plane(model::kHostPlaneName);
    stats_ = internal::CollectHostEvents(raw, start_ticks_, stop_ticks_, clock, &host);
    internal::recorder_release(word_);
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
  const internal::HostCollectStats& stats() const { return stats_; }

 private:
  int level_;
  internal::RecorderLimits limits_;
  uint64_t start_ticks_ = 0, stop_ticks_ = 0, word_ = 0;
  internal::HostCollectStats stats_;
};

}  // namespace

void RegisterTracerFactory(TracerFactory factory) {
  std::lock_guard<std::mutex> lock(factories_mu());
  factories().push_back(std::move(factory));
}

void ResetAfterForkChild() {
  internal::recorder_after_fork_child();
  g_session_active.store(false);
  new (&factories_mu()) std::mutex;
  new (&metadata_mu()) std::mutex;
  new (&process_name_mu()) std::mutex;
}

bool SessionActive() { return g_session_active.load(); }

void SetMetadata(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(metadata_mu());
  metadata()[key] = value;
}

void SetProcessName(const std::string& name) {
  std::lock_guard<std::mutex> lock(process_name_mu());
  process_name() = name;
}

std::string ProcessName() {
  {
    std::lock_guard<std::mutex> lock(process_name_mu());
    if (!process_name().empty()) return process_name();
  }
  std::ifstream f("/proc/self/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

void ClearMetadata() {
  std::lock_guard<std::mutex> lock(metadata_mu());
  metadata().clear();
}

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

Status Session::Create(const profiler::ProfileOptions& options, const std::string& busy_message,
                       std::unique_ptr<Session>* out) {
  if (Status s = profiler::ValidateOptions(options); !s.ok()) return s;
  bool expected = false;
  if (!g_session_active.compare_exchange_strong(expected, true)) return FailedPreconditionError(busy_message);
  std::unique_ptr<Session> session(new Session);
  session->options_ = options;
  if (options.start_timestamp_ns != 0) {
    uint64_t now = internal::wall_ns();
    if (options.start_timestamp_ns > now)
      std::this_thread::sleep_for(std::chrono::nanoseconds(options.start_timestamp_ns - now));
  }
  internal::init_clock();
  if (options.host_tracer_level > 0) {
    internal::RecorderLimits limits{Bound(options, "spyglass_buffer_bytes_per_thread", options.buffer_bytes_per_thread),
                                    Bound(options, "spyglass_buffer_bytes_total", options.buffer_bytes_total)};
    session->tracers_.push_back(std::make_unique<HostTracer>(options.host_tracer_level, limits));
  }
  {
    std::lock_guard<std::mutex> lock(factories_mu());
    for (const TracerFactory& f : factories())
      if (auto t = f(options)) session->tracers_.push_back(std::move(t));
  }
  session->start_wall_ns_ = internal::wall_ns();
  session->start_ticks_ = internal::now_ticks();
  for (auto& t : session->tracers_) {
    Status s = t->Start();
    if (!s.ok() && options.raise_error_on_start_failure) {
      session->stopped_ = true;
      for (auto& u : session->tracers_) (void)u->Stop();
      g_session_active.store(false);
      return s;
    }
  }
  *out = std::move(session);
  return Status::Ok();
}

Session::~Session() {
  if (!stopped_) {
    for (auto& t : tracers_) (void)t->Stop();
    g_session_active.store(false);
  }
}

Status Session::Stop(model::Space* space, SessionSummary* summary) {
  if (stopped_) return FailedPreconditionError("session already stopped");
  for (auto& t : tracers_) (void)t->Stop();
  uint64_t stop_wall_ns = internal::wall_ns();
  stopped_ = true;

  *space = model::Space{};
  space->plane(model::kHostPlaneName);  // present even when empty, as in JAX
  Status first_error;
  for (auto& t : tracers_) {
    Status s = t->CollectData(space);
    if (!s.ok()) {
      space->errors.push_back(s.ToString());
      if (first_error.ok()) first_error = s;
    }
    if (auto* host = dynamic_cast<HostTracer*>(t.get())) {
      summary->events += host->stats().events;
      summary->dropped_events += host->stats().dropped;
      summary->incomplete_events += host->stats().incomplete;
      summary->threads += host->stats().threads;
    }
  }
  g_session_active.store(false);

  if (options_.enable_hlo_proto) {
    model::Plane& md = space->plane(model::kMetadataPlaneName);
    md.stats.push_back(md.str_stat("spyglass_version", version()));
    md.stats.push_back(md.str_stat("hostname", Hostname()));
    md.stats.push_back(md.str_stat("pid", std::to_string(getpid())));
    md.stats.push_back(md.str_stat("command_line", CommandLine()));
    md.stats.push_back(md.str_stat("start_time_ns", std::to_string(start_wall_ns_)));
    std::lock_guard<std::mutex> lock(metadata_mu());
    for (const auto& [k, v] : metadata()) md.stats.push_back(md.str_stat(k, v));
  }
  model::Plane& env = space->plane(model::kTaskEnvPlaneName);
  env.stats.push_back(env.uint_stat("profile_start_time", start_wall_ns_));
  env.stats.push_back(env.uint_stat("profile_stop_time", stop_wall_ns));
  for (model::Plane& p : space->planes) {
    if (p.name.rfind("/device:", 0) != 0) p.id = 0;  // as JAX writes host-side planes
    if (p.find_stat_metadata("process_id") == nullptr) p.stats.push_back(p.int_stat("process_id", getpid()));
  }
  if (model::Plane* host = space->find_plane(model::kHostPlaneName))
    host->stats.push_back(host->str_stat("process_name", ProcessName()));
  space->hostnames.push_back(Hostname());
  return first_error;
}

}  // namespace spyglass::session
