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

#include "common/clock.h"
#include "session/flight_recorder.h"
#include "spyglass/profile_reader.h"  // kProfileFormatVersion
#include "spyglass/profiler.h"  // version()
#include "trace/recorder.h"

namespace spyglass {
const char* version() { return SPYGLASS_VERSION; }
}  // namespace spyglass

namespace spyglass::session {
namespace {

std::atomic<bool> g_session_active{false};

// The running flight recorder session, for snapshots; its lock keeps a
// snapshot and the session's stop apart.
std::mutex& ring_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
Session* g_ring_session = nullptr;

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

}  // namespace

void ResetAfterForkChild() {
  internal::recorder_after_fork_child();
  g_session_active.store(false);
  TracerRegistryAfterForkChild();
  new (&metadata_mu()) std::mutex;
  new (&process_name_mu()) std::mutex;
  new (&ring_mu()) std::mutex;
  g_ring_session = nullptr;
  FlightRecorderAfterForkChild();
}

bool SessionActive() { return g_session_active.load(); }

bool FlightRecorderActive() {
  std::lock_guard<std::mutex> lock(ring_mu());
  return g_ring_session != nullptr;
}

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
  session->tracers_ = CreateTracers(options);  // in start order
  session->start_wall_ns_ = internal::wall_ns();
  session->start_ticks_ = internal::now_ticks();
  const uint64_t mono_ns = internal::monotonic_ns();
  for (auto& t : session->tracers_) t->zero_ = {session->start_wall_ns_, session->start_ticks_, mono_ns};
  for (size_t i = 0; i < session->tracers_.size(); ++i) {
    Status s = session->tracers_[i]->Start();
    if (!s.ok() && options.raise_error_on_start_failure) {
      session->stopped_ = true;
      for (size_t j = i + 1; j-- > 0;) (void)session->tracers_[j]->Stop();  // the failed one too
      g_session_active.store(false);
      return s;
    }
  }
  FlightRecorderConfig ring;
  if (ResolveFlightRecorder(options, &ring).ok() && ring.seconds > 0) {
    session->ring_seconds_ = ring.seconds;
    std::lock_guard<std::mutex> lock(ring_mu());
    g_ring_session = session.get();
  }
  *out = std::move(session);
  return Status::Ok();
}

void Session::Unregister() {
  if (ring_seconds_ == 0) return;
  std::lock_guard<std::mutex> lock(ring_mu());
  if (g_ring_session == this) g_ring_session = nullptr;
}

Status Session::SnapshotFlightRecorder(model::Space* space) {
  std::lock_guard<std::mutex> lock(ring_mu());
  Session* s = g_ring_session;
  if (s == nullptr)
    return FailedPreconditionError("no flight recorder runs in this process (start a trace with "
                                   "ring_buffer_seconds > 0 / spyglass_ring_buffer_seconds)");
  internal::TickConverter clock = internal::TickConverter::Calibrate();
  uint64_t now_ticks = internal::now_ticks();
  uint64_t now_wall = internal::wall_ns();
  uint64_t span = static_cast<uint64_t>(static_cast<double>(s->ring_seconds_) * 1e9 / clock.ns_per_tick());
  uint64_t since = now_ticks - s->start_ticks_ > span ? now_ticks - span : s->start_ticks_;
  *space = model::Space{};
  space->plane(model::kHostPlaneName);
  for (auto& t : s->tracers_) {
    Status st = t->Snapshot(space, since, now_ticks);
    if (!st.ok()) space->errors.push_back(st.ToString());
  }
  s->Finish(space, now_wall - static_cast<uint64_t>(clock.ns_between(since, now_ticks)), now_wall);
  return Status::Ok();
}

Session::~Session() {
  Unregister();
  if (!stopped_) {
    StopTracers();
    g_session_active.store(false);
  }
}

void Session::StopTracers() {
  for (auto t = tracers_.rbegin(); t != tracers_.rend(); ++t) (void)(*t)->Stop();
}

Status Session::Stop(model::Space* space, SessionSummary* summary) {
  if (stopped_) return FailedPreconditionError("session already stopped");
  Unregister();
  StopTracers();
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
    t->AddStats(summary);
  }
  g_session_active.store(false);
  // A flight recorder's run holds its last ring_seconds_ (as its tracers cut it).
  uint64_t start_wall = start_wall_ns_;
  if (ring_seconds_ > 0 && stop_wall_ns - start_wall > ring_seconds_ * 1000000000ull)
    start_wall = stop_wall_ns - ring_seconds_ * 1000000000ull;
  Finish(space, start_wall, stop_wall_ns);
  return first_error;
}

void Session::Finish(model::Space* space, uint64_t start_wall_ns, uint64_t stop_wall_ns) const {
  if (options_.enable_hlo_proto) {
    model::Plane& md = space->plane(model::kMetadataPlaneName);
    md.stats.push_back(md.str_stat(model::kVersionMetadata, version()));
    md.stats.push_back(md.int_stat(model::kFormatVersionMetadata, profile::kProfileFormatVersion));
    md.stats.push_back(md.str_stat(model::kHostnameMetadata, Hostname()));
    md.stats.push_back(md.str_stat(model::kPidMetadata, std::to_string(getpid())));
    md.stats.push_back(md.str_stat(model::kCommandLineMetadata, CommandLine()));
    md.stats.push_back(md.str_stat(model::kStartTimeMetadata, std::to_string(start_wall_ns_)));
    std::lock_guard<std::mutex> lock(metadata_mu());
    for (const auto& [k, v] : metadata()) md.stats.push_back(md.str_stat(k, v));
  }
  model::Plane& env = space->plane(model::kTaskEnvPlaneName);
  env.stats.push_back(env.uint_stat(model::kProfileStartTimeStat, start_wall_ns));
  env.stats.push_back(env.uint_stat(model::kProfileStopTimeStat, stop_wall_ns));
  for (model::Plane& p : space->planes) {
    if (p.name.rfind("/device:", 0) != 0) p.id = 0;  // as JAX writes host-side planes
    if (p.find_stat_metadata(model::kProcessIdStat) == nullptr) p.stats.push_back(p.int_stat(model::kProcessIdStat, getpid()));
  }
  if (model::Plane* host = space->find_plane(model::kHostPlaneName))
    host->stats.push_back(host->str_stat(model::kProcessNameStat, ProcessName()));
  space->hostnames.push_back(Hostname());
}

}  // namespace spyglass::session
