// Spyglass: the public C++ API, with the semantics of jax.profiler.
//
//   #include <spyglass/profiler.h>
//   namespace prof = spyglass::profiler;
//   if (auto s = prof::start_trace("/tmp/logs"); !s.ok()) ...;
//   { prof::StepTraceAnnotation step("train", i); ... }
//   prof::stop_trace();   // writes plugins/profile/<run>/<host>.xplane.pb, .trace.json.gz
//
// Thread safety: every function here may be called from any thread. Only one
// session runs at a time in a process.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spyglass/api.h"
#include "spyglass/annotation.h"
#include "spyglass/memory.h"
#include "spyglass/options.h"
#include "spyglass/server.h"
#include "spyglass/status.h"

namespace spyglass {

// "0.1.0"
SPYGLASS_API const char* version();

namespace profiler {

// Starts a session that records annotations until stop_trace. Fails with
// FailedPrecondition "Profile has already been started. Only one profile may
// be run at a time." if one runs, and with InvalidArgument (naming the key)
// for bad options, before anything starts. An empty log_dir keeps the trace
// in memory only (jax.profiler.trace(None)): stop_trace writes nothing, and
// export_last_trace writes it later.
SPYGLASS_API Status start_trace(const std::string& log_dir, const TraceOptions& options = {});

// Stops the session and writes its files under log_dir (see docs/tracing.md). Fails
// with FailedPrecondition "No profile started" without a session. If writing
// fails, the session is still stopped and its data kept: export_last_trace
// can write it elsewhere.
SPYGLASS_API Status stop_trace();

// Writes the last stopped session's data again, into another log dir.
SPYGLASS_API Status export_last_trace(const std::string& log_dir, const TraceOptions& options = {});

// Where the last stop_trace/export_last_trace wrote (empty if nothing yet).
struct TraceFiles {
  std::string run_dir;
  std::string xplane_path;
  std::string trace_json_path;
  std::string perfetto_trace_path;  // empty unless requested
};
SPYGLASS_API TraceFiles last_trace_files();

// What the last stopped session recorded and dropped.
struct TraceStats {
  uint64_t events = 0;
  uint64_t dropped_events = 0;     // buffer bounds reached
  uint64_t incomplete_events = 0;  // still open at stop; closed at stop time
  uint64_t threads = 0;
  uint64_t cpu_samples = 0;  // spyglass_cpu_sample_hz > 0: the samples taken
};
SPYGLASS_API TraceStats last_trace_stats();

// RAII form of start_trace/stop_trace: stops at scope exit.
class [[nodiscard]] SPYGLASS_API TraceScope {
 public:
  TraceScope(const std::string& log_dir, const TraceOptions& options = {});
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  // The start's status; if not ok, the destructor does nothing.
  const Status& status() const { return start_status_; }
  bool ok() const { return start_status_.ok(); }
  // Stops now and returns the stop's status (the destructor then does nothing;
  // a failed stop in the destructor is printed to stderr).
  Status stop();

 private:
  Status start_status_;
  bool running_ = false;
};

inline TraceScope trace(const std::string& log_dir, const TraceOptions& options = {}) {
  return TraceScope(log_dir, options);
}

// Flight recorder: start_trace with ProfileOptions::ring_buffer_seconds > 0
// records continuously into a bounded ring. dump_flight_recorder writes the
// ring's last ring_buffer_seconds as a normal run (<log_dir>/plugins/profile/
// <run>/: .xplane.pb and .trace.json.gz; last_trace_files() names them) and
// the recorder runs on. An empty log_dir means start_trace's. Fails with
// FailedPrecondition when no flight recorder runs.
SPYGLASS_API Status dump_flight_recorder(const std::string& log_dir = "");

// Whether a flight recorder runs now.
SPYGLASS_API bool flight_recorder_active();

// Names shown for threads and the process in the outputs. By default the OS
// thread name (pthread_getname_np) and the program name are used.
SPYGLASS_API void set_thread_name(std::string_view name);
SPYGLASS_API void set_process_name(std::string_view name);

// Profiler metadata recorded in the /host:metadata plane (jax's set_metadata).
SPYGLASS_API void set_metadata(const std::string& key, const std::string& value);
SPYGLASS_API void clear_metadata();

}  // namespace profiler
}  // namespace spyglass
