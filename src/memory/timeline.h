// Live bytes over time, at bounded cost: per device (live now and the
// highest value since the previous point) and the top call sites, sampled
// into a fixed ring of kTimelinePoints points. Points are taken by the
// allocating threads themselves: every kTimelineCheckOps (128) records or
// removes of a thread, one clock read decides whether the interval has
// passed (no lock on the hot path; a try-lock lets one thread write a point,
// the others go on). When the ring is full, neighbouring points are merged
// (the maximum kept) and the interval doubles, so any run length fits.
// A point scans the site table for the top sites; the interval is raised to
// at least 50x the scan's duration, so that scans stay under 2% of the time.
//
// The series is written beside the exit profile as
// memory.<pid>.<comm>.timeline.tsv (FormatTimeline; the format is in
// docs/memory.md), read back with ReadTimelineFile (spyglass memtop
// --over-time), and read in process with CurrentTimeline (the trace's
// counter tracks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/tracker.h"
#include "spyglass/status.h"

namespace spyglass::memory {

inline constexpr int kTimelinePoints = 512;
inline constexpr int kTimelineDevices = 8;   // devices beyond the first 8 are not in the series
inline constexpr int kTimelineTopSites = 8;  // sites per point
inline constexpr int64_t kTimelineFirstIntervalNs = 1000000;  // 1 ms, doubled at each merge

struct TimelinePoint {
  int64_t t_ns = 0;                 // since the timeline's start
  std::vector<int64_t> live;        // per device (Timeline::devices)
  std::vector<int64_t> max;         // highest live bytes since the previous point, per device
  std::vector<std::pair<uint32_t, int64_t>> sites;  // (site id, live bytes): that point's top sites
};
struct TimelineSite {
  uint32_t id = 0;
  std::string device;
  std::string stack;  // "inner <- caller <- ..." (at most 6 frames), "" for a site without a stack
};
struct Timeline {
  int64_t start_monotonic_ns = 0;  // CLOCK_MONOTONIC of t_ns = 0
  int64_t interval_ns = 0;         // spacing of the points now
  std::vector<std::string> devices;
  std::vector<int64_t> peak_bytes;  // per device: the high-water mark (as save_peak_profile's)
  std::vector<TimelineSite> sites;  // every site that appears in a point
  std::vector<TimelinePoint> points;
};

// Takes a point now (whatever the interval), e.g. before reading the series at exit.
SPYGLASS_MEM_EXPORT void TimelineSampleNow();
// The series so far. `symbolize`: name the sites' stacks (a symbolization: call
// outside malloc, it allocates untracked).
SPYGLASS_MEM_EXPORT Timeline CurrentTimeline(bool symbolize = true);
// Forgets the points (a forked child starts its own series).
SPYGLASS_MEM_EXPORT void TimelineReset();

// The .timeline.tsv text, and back. ParseTimeline refuses malformed text
// with an error quoting a bounded prefix of the bad line; at most
// kMaxTimelineBytes are read.
inline constexpr size_t kMaxTimelineBytes = 64ull << 20;
SPYGLASS_MEM_EXPORT std::string FormatTimeline(const Timeline& t);
SPYGLASS_MEM_EXPORT Status ParseTimeline(std::string_view text, Timeline* out);
SPYGLASS_MEM_EXPORT Status ReadTimelineFile(const std::string& path, Timeline* out);
// Takes a last point and writes the series to `path` (overwritten).
SPYGLASS_MEM_EXPORT Status SaveTimeline(const std::string& path);

// ---- file names (one place; `spyglass run` and the heap hook use them) ------------
// The process's name as /proc/<pid>/comm has it, made safe for a file name
// (characters other than [A-Za-z0-9._+-] become '_'; "unknown" if empty).
SPYGLASS_MEM_EXPORT std::string SafeComm(std::string_view comm);
// /proc/self/comm, through SafeComm.
SPYGLASS_MEM_EXPORT std::string SelfComm();
// "memory.<pid>.<comm>.<tag>.prof"; tag: "exit", "peak", "oom", or a snapshot number.
SPYGLASS_MEM_EXPORT std::string MemoryProfileName(long pid, std::string_view comm, std::string_view tag);
// "memory.<pid>.<comm>.timeline.tsv".
SPYGLASS_MEM_EXPORT std::string MemoryTimelineName(long pid, std::string_view comm);

}  // namespace spyglass::memory
