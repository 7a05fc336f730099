// A profiling session: owns the tracers of one capture. The same code serves
// start_trace/stop_trace, a remote capture, and a subprocess's part of one.
// Only one session runs in a process at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/xspace.h"
#include "session/tracer.h"
#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::session {

class Session {
 public:
  // Validates options, takes the process-wide profiler lock and starts the
  // registered tracers in rank order (session/tracer.h). Fails with
  // FailedPrecondition `busy_message` if a session runs.
  static Status Create(const profiler::ProfileOptions& options, const std::string& busy_message,
                       std::unique_ptr<Session>* out);
  ~Session();  // stops (discarding data) if Stop was not called

  // Stops the tracers and builds the post-processed XSpace model (host plane,
  // metadata, Task Environment, process_id on every plane, hostnames).
  Status Stop(model::Space* space, SessionSummary* summary);

  // Flight recorder: the running ring session's last ring_buffer_seconds as
  // a model (as Stop builds it), the session running on. FailedPrecondition
  // when no flight recorder runs.
  static Status SnapshotFlightRecorder(model::Space* space);

  const profiler::ProfileOptions& options() const { return options_; }
  uint64_t start_wall_ns() const { return start_wall_ns_; }

 private:
  Session() = default;
  void StopTracers();  // in reverse start order
  // What Stop and a snapshot add after the tracers' data: metadata, Task
  // Environment (the window's wall-clock bounds), process ids, hostnames.
  void Finish(model::Space* space, uint64_t start_wall_ns, uint64_t stop_wall_ns) const;
  void Unregister();  // no longer the flight recorder (if it was)
  profiler::ProfileOptions options_;
  std::vector<std::unique_ptr<Tracer>> tracers_;
  uint64_t start_wall_ns_ = 0;
  uint64_t start_ticks_ = 0;
  uint64_t ring_seconds_ = 0;  // > 0: a flight recorder
  bool stopped_ = false;
};

// In a forked child: no session runs (the parent's belongs to the parent).
void ResetAfterForkChild();

// Whether a session runs now (any kind).
bool SessionActive();
// Whether a flight recorder session runs now.
bool FlightRecorderActive();

// Profiler metadata (jax set_metadata), recorded on /host:metadata.
void SetMetadata(const std::string& key, const std::string& value);
void ClearMetadata();

std::string Hostname();

// The name shown for this process (default: /proc/self/comm).
void SetProcessName(const std::string& name);
std::string ProcessName();

}  // namespace spyglass::session
