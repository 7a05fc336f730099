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

// What a server's reply may make the client write (tool_data entries beyond
// these are skipped with a warning): the count and total bytes per host, and
// the length of a name (letters, digits, '.', '_', '-'; not starting with '.').
inline constexpr size_t kMaxToolFiles = 16;
inline constexpr size_t kMaxToolBytes = 64u << 20;
inline constexpr size_t kMaxToolNameBytes = 64;

struct CaptureOptions {
  uint64_t duration_ms = 0;  // > 0, at most max_duration_ms
  uint64_t max_duration_ms = 3600000;
  uint64_t delay_ms = 0;     // every server starts at (now + delay_ms), at most max_delay_ms
  uint64_t max_delay_ms = 3600000;
  // The largest reply accepted from one server (1 .. INT_MAX, gRPC's own
  // limit); a larger one fails that host. The client's peak memory is about
  // 3x a reply: its bytes and the trace model imported from them in pieces.
  uint64_t max_reply_bytes = 1024ull << 20;
  // The trace JSON written for one host may be at most this many times its
  // reply (plus 64 MiB); a reply whose JSON would be larger (long names
  // repeated by many events) gets its .xplane.pb only, and a warning. Our
  // own traces make about 6 bytes of JSON per byte of reply.
  uint64_t max_trace_json_expansion = 32;
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
  std::string perfetto_trace_path;       // perfetto_trace.pb
  std::string perfetto_trace_json_path;  // perfetto_trace.json.gz (as JAX), the link's file
  std::vector<std::string> warnings;
};

// Captures all `addresses` ("host:port") in the same window and writes
// <log_dir>/plugins/profile/<run>/<host>.xplane.pb and <host>.trace.json.gz
// per host (and perfetto_trace.pb and perfetto_trace.json.gz of all hosts, each process under its
// own pid, if asked). Succeeds if at least one host returned events; the
// others are named in result->warnings. A failed capture removes the
// directories it made when they are still empty. Files are created as every
// output is (export/output_file.h): never through a symbolic link.
Status Capture(const std::vector<std::string>& addresses, const CaptureOptions& options, const std::string& log_dir,
               CaptureResult* result);

}  // namespace spyglass::server
