// The flight recorder's crash dump: the ring written as a minimal XSpace
// (<host>.xplane.pb, host plane only) from a fatal-signal handler, with
// async-signal-safe code only: no lock, no allocation, no stdio; the file and
// the directory it goes into were opened when the recorder started.
#pragma once

#include <cstdint>

#include "common/kept_fd.h"

namespace spyglass::internal {

struct CrashTarget {
  // Kept high and checked before each use (common/kept_fd.h): a program may
  // close every descriptor and put its own files at those numbers.
  kept_fd::KeptFd dir;      // <log_dir>/plugins/profile, opened at start (no link followed)
  kept_fd::KeptFd file;     // the file written, made at start in dir: unnamed
                            // (O_TMPFILE, nothing left behind whatever ends the
                            // process) where the file system allows, else tmp_name
  bool file_named = false;  // file is dir/tmp_name (no O_TMPFILE)
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

// Writes the ring (its last ring_seconds) into the crash file, makes
// run_name in dir and puts the file there as file_name. When the file's
// descriptor is no longer ours, a new file is made in dir under tmp_name;
// when dir's is not ours, nothing is written. Returns false when any step
// failed, with *why (static text) saying which; nothing is left behind then
// (no temporary file, no empty run directory).
bool WriteCrashRun(const CrashTarget& target, int sig, const char** why);

}  // namespace spyglass::internal
