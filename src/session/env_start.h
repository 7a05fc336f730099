// Profiling started from outside the program: the SPYGLASS_* environment
// (libspyglass at load, the Python package at import) and the flags of
// `spyglass run` / `python -m spyglass run`, which name the same settings.
//
//   SPYGLASS_TRACE_DIR=DIR           a trace from start to exit, written under DIR
//   SPYGLASS_SERVER_PORT=[ADDR:]PORT the profiler server (127.0.0.1 unless ADDR)
//   SPYGLASS_FLIGHT_RECORDER=SECONDS the flight recorder (a trace in ring-buffer mode),
//                                    keeping the last SECONDS; its dumps and its
//                                    last window at exit go to SPYGLASS_TRACE_DIR
//                                    (default <tmp>/spyglass-<uid>/flight-recorder,
//                                    mode 0700; refused if another user owns it
//                                    or others may write it)
//   SPYGLASS_OPTIONS=key=value,...   ProfileOptions fields and advanced keys
//
// A bad value is one line on stderr and nothing is started: the program runs
// on, unprofiled.
#pragma once

#include <functional>
#include <string>

#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::session {

inline constexpr const char* kEnvTraceDir = "SPYGLASS_TRACE_DIR";
inline constexpr const char* kEnvServerPort = "SPYGLASS_SERVER_PORT";
inline constexpr const char* kEnvFlightRecorder = "SPYGLASS_FLIGHT_RECORDER";
inline constexpr const char* kEnvOptions = "SPYGLASS_OPTIONS";

struct StartSettings {
  std::string trace_dir;  // absolute
  bool server = false;
  std::string server_address = "127.0.0.1";
  int server_port = 0;  // 0: a free port (printed)
  int flight_recorder_seconds = 0;
  profiler::ProfileOptions options;  // the base (Python: python_tracer_level=1) plus SPYGLASS_OPTIONS
  bool empty() const { return trace_dir.empty() && !server && flight_recorder_seconds <= 0; }
};

// Reads the four settings through `get` (a name -> value or nullptr, e.g.
// getenv) on top of `out->options`. InvalidArgument, one line naming the
// setting and quoting a bounded prefix of its value.
Status ParseStartSettings(const std::function<const char*(const char*)>& get, StartSettings* out);

struct Started {
  bool trace = false;
  bool flight_recorder = false;
  int server_port = 0;  // 0: none
};

// Starts what `s` asks for (what fails is a line "spyglass: ..." on stderr;
// the rest runs). StopStarted() ends it: the trace (or the flight recorder's
// last window) is written and its directory printed, the server stopped. It
// does nothing in a forked child of the process that started.
Started StartFromSettings(const StartSettings& s);
void StopStarted();

// The environment, as libspyglass reads it at load: parse, start, and stop
// at exit (atexit). Returns what started.
Started StartFromEnvironment(const profiler::ProfileOptions& base, bool stop_at_exit);

}  // namespace spyglass::session
