// The flight recorder's crash dump: the ring written as a minimal XSpace
// (<host>.xplane.pb, host plane only) from a fatal-signal handler, with
// async-signal-safe code only: no lock, no allocation, no stdio; the file and
// the directory it goes into were opened when the recorder started.
#pragma once

#include <cstdint>

namespace spyglass::internal {

struct CrashTarget {
  int dir_fd = -1;          // <log_dir>/plugins/profile, opened at start (no link followed)
  int tmp_fd = -1;          // the file written, made at start in dir_fd as tmp_name
  char tmp_name[64] = {};
  char run_name[96] = {};   // the run directory made at the crash
  char file_name[300] = {}; // "<host>.xplane.pb"
  char hostname[256] = {};
  uint64_t word = 0;        // the session word the ring records under
  uint64_t ring_seconds = 0;
  // Clock at start: ticks and CLOCK_MONOTONIC/REALTIME ns read together,
  // and the tick rate measured then (refined at the crash from the span).
  uint64_t start_ticks = 0;
  uint64_t start_mono_ns = 0;
  uint64_t start_wall_ns = 0;
  double ns_per_tick = 1.0;
  int64_t pid = 0;
};

// Writes the ring (its last ring_seconds) into tmp_fd, makes run_name in
// dir_fd and renames the file there as file_name. Returns false when any
// step failed (what was written stays under tmp_name).
bool WriteCrashRun(const CrashTarget& target, int sig);

}  // namespace spyglass::internal
