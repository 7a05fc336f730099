// What a Profile request may ask of this process: its options checked and
// bounded against the server's (ServerOptions), before anything is started or
// created. Free of gRPC, so that tests and the fuzz target call it directly.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "profiler_service.pb.h"
#include "server/path_policy.h"
#include "spyglass/options.h"
#include "spyglass/server.h"
#include "spyglass/status.h"

namespace spyglass::server {

// The duration of the subprocess protocol's captures: until Terminate.
inline constexpr uint64_t kUntilTerminate = std::numeric_limits<uint64_t>::max();

struct PreparedCapture {
  profiler::ProfileOptions options;   // validated; start_timestamp_ns cleared, buffers clamped
  uint64_t duration_ms = 0;           // or kUntilTerminate
  uint64_t delay_ns = 0;              // how long to wait before starting
  std::string session_id;             // what Terminate names (and the run directory)
  ProfileTarget target;               // where to write, when write_file
  // The request did not ask for emit_xspace: the server writes
  // target.file when it has an allowed_log_root; without one it writes
  // nothing and replies with the file as tool_data "xplane.pb", which the
  // client saves as <repository_root>/<session_id>/<host>.xplane.pb itself.
  bool write_file = false;
  std::vector<std::string> warnings;  // for the capture's output (clamped buffers)
};

// Checks `req` (durations, start delay, session id, options, and where it
// would write) against `server`, at wall time `now_ns`. Creates nothing;
// errors are InvalidArgument and quote a bounded prefix of the input.
Status PrepareCapture(const profiler::ServerOptions& server, const tensorflow::ProfileRequest& req, uint64_t now_ns,
                      PreparedCapture* out);

// The Terminate request's session id: InvalidArgument if longer than a file
// name may be (kMaxNameBytes).
Status CheckTerminateId(const std::string& session_id);

}  // namespace spyglass::server
