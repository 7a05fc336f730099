// The profiler server (on-demand remote capture) and subprocess registration,
// as jax.profiler.start_server / stop_server / register_subprocess.
// Implemented in src/server/.
//
// The server speaks gRPC service tensorflow.ProfilerService (the one of
// JAX/TSL), so `python -m jax.collect_profile`, XProf's CAPTURE PROFILE
// button and `spyglass collect` can all capture a program that called
// start_server.
//
// What a client can make the server do is bounded by ServerOptions (below)
// and fixed limits: Terminate session ids longer than 255 bytes are refused
// and at most 256 unconsumed ids are remembered; errors quote at most 96
// bytes of any field of the request; memory a capture used is given back to
// the system after its reply was sent.
//
// Thread-safety: every function here may be called from any thread. One
// server runs per process. A capture through the server takes the same
// process-wide lock as start_trace: while one runs, the other fails with a
// FailedPrecondition "already profiling" error.
#pragma once

#include <cstdint>
#include <string>

#include "spyglass/api.h"
#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::profiler {

struct ServerOptions {
  // The address the server listens on. The default accepts connections from
  // this machine only (any local user). "0.0.0.0" or "::" listen on every
  // interface: then anyone who can reach the port can start a capture (there
  // is no authentication in the protocol).
  std::string bind_address = "127.0.0.1";
  // Longest capture a request may ask for; longer ones are rejected with
  // InvalidArgument. (The subprocess protocol's "until Terminate" duration,
  // UINT64_MAX, is always accepted: such a capture ends on Terminate or when
  // the client disconnects.)
  uint64_t max_duration_ms = 3600000;
  // Where a request may make this process write. Empty (the default, unless
  // the environment variable SPYGLASS_ALLOWED_LOG_ROOT sets it): the server
  // creates no file. A request that does not ask for emit_xspace gets the
  // profile back as tool data "xplane.pb", which the client writes to
  // <repository_root>/<session_id>/<host>.xplane.pb itself (tsl's capture:
  // jax.collect_profile, XProf's and TensorBoard's CAPTURE PROFILE).
  // When set (a clean absolute path), such a request makes this process
  // write that file, as the reference server does: repository_root must lie
  // inside this directory, be absolute, end in "plugins/profile", and have
  // no "..", "." or symbolic link in an existing component below it; the
  // profile's whole path stays under 4096 bytes, each name (and the session
  // id) at most 255 bytes, and one request creates at most 8 directories.
  std::string allowed_log_root;
  // Latest start a request may ask for (opts.start_timestamp_ns), in ms from
  // now; later ones are rejected with InvalidArgument. A request waits for
  // its start without holding the profiler (start_trace and other captures
  // run meanwhile); the wait ends early, with CANCELLED, when the client goes
  // away, Terminate names its session id, or stop_server is called. At most
  // 8 requests wait at once; more fail with Unavailable.
  uint64_t max_start_delay_ms = 60000;
  // Ceilings of the trace buffers a request may ask for (advanced keys
  // "spyglass_buffer_bytes_per_thread" / "spyglass_buffer_bytes_total").
  // Larger requests are clamped to these, with a warning in the capture's
  // output. Default: the program's own defaults (ProfileOptions).
  uint64_t max_buffer_bytes_per_thread = ProfileOptions{}.buffer_bytes_per_thread;
  uint64_t max_buffer_bytes_total = ProfileOptions{}.buffer_bytes_total;
};

// Starts the server on `port` (1..65535; 0 picks a free port, see
// server_port()). Errors: AlreadyExists if one is already running,
// InvalidArgument for a bad port/address, Unavailable if the port is in use
// or cannot be bound, InvalidArgument for an allowed_log_root that is not a
// clean absolute path.
SPYGLASS_API Status start_server(int port, const ServerOptions& options = {});
// The environment variable that sets ServerOptions::allowed_log_root when
// the options leave it empty (servers started from Python or by
// SPYGLASS_SERVER_PORT).
inline constexpr const char* kEnvAllowedLogRoot = "SPYGLASS_ALLOWED_LOG_ROOT";
// Stops the server; waits for in-flight requests (a running capture is
// cancelled). FailedPrecondition if none runs.
SPYGLASS_API Status stop_server();
// The port the running server listens on, or 0.
SPYGLASS_API int server_port();

// The unregister handle of register_subprocess: unregisters when destroyed,
// or earlier with unregister() / operator(). Move-only; calling it twice is
// harmless.
class SPYGLASS_API SubprocessRegistration {
 public:
  SubprocessRegistration() = default;
  ~SubprocessRegistration() { unregister(); }
  SubprocessRegistration(SubprocessRegistration&& other) noexcept : pid_(other.pid_) { other.pid_ = 0; }
  SubprocessRegistration& operator=(SubprocessRegistration&& other) noexcept {
    if (this != &other) {
      unregister();
      pid_ = other.pid_;
      other.pid_ = 0;
    }
    return *this;
  }
  SubprocessRegistration(const SubprocessRegistration&) = delete;
  SubprocessRegistration& operator=(const SubprocessRegistration&) = delete;

  void unregister();
  void operator()() { unregister(); }
  bool registered() const { return pid_ != 0; }
  int pid() const { return pid_; }

 private:
  friend Status register_subprocess(int, int, SubprocessRegistration*, int);
  int pid_ = 0;
};

// Registers the profiler server of child process `pid`, listening on
// 127.0.0.1:`port`. While registered, every capture of this process (remote
// through start_server, or start_trace) also captures the child, unless its
// options set the advanced key "profile_subprocesses" to false: the child's
// planes are merged into this process's output as "<plane> [<pid>]", on this
// process's time base. A child that died or does not answer leaves a warning
// naming it in the output; the capture still succeeds.
// Waits up to `connect_timeout_ms` for the child's server to accept a
// connection. Errors: InvalidArgument (own pid, bad pid or port),
// AlreadyExists (pid already registered), DeadlineExceeded (not reachable).
SPYGLASS_API Status register_subprocess(int pid, int port, SubprocessRegistration* out, int connect_timeout_ms = 30000);

}  // namespace spyglass::profiler
