// The capture client: asks one or more profiler servers (Spyglass or
// JAX/TSL, tensorflow.ProfilerService) to record for a while and writes what
// they return as a local trace. `spyglass collect` is a thin layer over this.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::server {

struct CaptureOptions {
  uint64_t duration_ms = 0;  // > 0, at most max_duration_ms
  uint64_t max_duration_ms = 3600000;
  uint64_t delay_ms = 0;     // every server starts at (now + delay_ms)
  // Levels, session_id (run directory name) and advanced_configuration sent
  // to the servers. Defaults as jax.collect_profile: host 2, device 1, python 1.
  profiler::ProfileOptions profile = [] {
    profiler::ProfileOptions o;
    o.python_tracer_level = 1;
    return o;
  }();
  // One name per address for the output files (else the address, ':'->'_').
  std::vector<std::string> override_hostnames;
  int connect_timeout_ms = 10000;  // a server that does not accept by then fails
  bool create_perfetto_trace = false;
  std::ostream* log = nullptr;     // progress and warnings; nullptr: quiet
};

struct CaptureHostResult {
  std::string address;
  std::string xplane_path;      // empty if this host failed
  std::string trace_json_path;
  std::string error;            // why it failed, if it did
  bool empty = false;
};

struct CaptureResult {
  std::string run_dir;
  std::vector<CaptureHostResult> hosts;
  std::string perfetto_trace_path;
  std::vector<std::string> warnings;
};

// Captures all `addresses` ("host:port") in the same window and writes
// <log_dir>/plugins/profile/<run>/<host>.xplane.pb and <host>.trace.json.gz
// per host (and perfetto_trace.json.gz of all hosts, each process under its
// own pid, if asked). Succeeds if at least one host returned events; the
// others are named in result->warnings.
Status Capture(const std::vector<std::string>& addresses, const CaptureOptions& options, const std::string& log_dir,
               CaptureResult* result);

}  // namespace spyglass::server
