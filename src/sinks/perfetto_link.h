// The one-shot local HTTP server behind JAX's `create_perfetto_link=True`
// (FORMATS.md section (d)): it serves one trace file (perfetto_trace.json.gz,
// as JAX; a native perfetto_trace.pb works the same) on port 9001
// so that https://ui.perfetto.dev can fetch it cross-origin.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::sinks {

struct PerfettoLinkOptions {
  std::string bind_address = "127.0.0.1";  // loopback only unless the caller says otherwise
  int port = 9001;              // ui.perfetto.dev expects 9001; 0 picks a free port (tests)
  // How long to wait for the browser; 0 waits until fetched (as JAX does).
  int timeout_s = profiler::kDefaultPerfettoLinkTimeoutS;
  std::ostream* out = nullptr;  // where the link line is printed; nullptr: std::cout
  // Called once the socket listens, with the actual port (useful with port 0).
  std::function<void(int port)> on_listening;
  // Checked every 100 ms while waiting; true stops the wait with Cancelled.
  // (No signal handler is installed: the program's own Ctrl-C handling stays
  // in force; the Python binding checks for KeyboardInterrupt here.)
  std::function<bool()> cancelled;
};

// Serves `trace_path` (perfetto_trace.json.gz or a .pb) once for https://ui.perfetto.dev:
// prints "Open URL in browser: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/<basename>"
// and blocks until a GET of exactly "/<basename>" was answered in full.
// Errors: NotFound (file missing or unreadable, checked before binding),
// InvalidArgument (bad port or bind_address), Unavailable (port in use or not
// bindable), DeadlineExceeded (timeout_s passed), Cancelled (`cancelled`
// returned true), Internal.
// Never throws.
Status ServePerfettoTrace(const std::string& trace_path, const PerfettoLinkOptions& options = {});

}  // namespace spyglass::sinks
