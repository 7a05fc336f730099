// The flight recorder (ring-buffer mode): its settings, and the triggers that
// dump its ring while it runs (a signal, a slow step, a crash). The ring is
// the host recorder's (src/trace/recorder.h); the dump of a running session
// is Session::SnapshotFlightRecorder; dump_flight_recorder (profiler.h) and
// the profiler server's flight-recorder capture call it.
#pragma once

#include <cstdint>
#include <string>

#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::session {

struct FlightRecorderConfig {
  uint64_t seconds = 0;  // 0: no flight recorder
  uint64_t bytes = 0;    // the ring's memory budget (all threads)
  int dump_signal = 0;   // 0: none
  uint64_t slow_step_ms = 0;  // 0: off
  bool dump_on_crash = true;
};

// The settings of `o` (advanced keys win over fields). InvalidArgument for a
// bad signal name or a ring smaller than two buffer chunks.
Status ResolveFlightRecorder(const profiler::ProfileOptions& o, FlightRecorderConfig* out);

// Starts the triggers of a flight recorder that start_trace started with
// `config`, dumping into `log_dir`: a thread that dumps on the signal and on
// slow steps, the signal handler, and the crash handler (with its file opened
// now). Stopped by StopFlightRecorderTriggers (stop_trace).
Status StartFlightRecorderTriggers(const std::string& log_dir, const FlightRecorderConfig& config);
void StopFlightRecorderTriggers();
// In a forked child: the parent's triggers are dropped (not stopped).
void FlightRecorderAfterForkChild();

}  // namespace spyglass::session
