// Turns what the recorder holds (raw per-thread records) into the host plane
// of the model: one line per thread, events in start order with their args.
#pragma once

#include <vector>

#include "model/xspace.h"
#include "common/clock.h"
#include "trace/recorder.h"

namespace spyglass::internal {

struct HostCollectStats {
  uint64_t events = 0;
  uint64_t dropped = 0;
  uint64_t incomplete = 0;  // open at stop, closed at the stop time
  uint64_t threads = 0;
  uint64_t overwritten = 0;  // ring mode: begins overwritten since the start
  // Ring mode: the latest tick before which some thread's events were
  // overwritten (0: none); after `since_ticks`, the ring held less than asked.
  uint64_t held_since_ticks = 0;
};

// `start_ticks`/`stop_ticks` bound the session; event times become offsets
// from the session start (line timestamp 0, as the reference normalizes).
// Events begun before `since_ticks` are left out (a flight recorder's dump
// starts inside its ring; then since_ticks == start_ticks); their ends and
// arguments are skipped with them.
HostCollectStats CollectHostEvents(const std::vector<RawThread>& threads, uint64_t start_ticks,
                                   uint64_t stop_ticks, const TickConverter& clock, model::Plane* plane,
                                   uint64_t since_ticks = 0);

// Splits a TraceMe-encoded name "name#k=v,k2=v2#" into the name and its
// arguments, with the reference parser's rules (FORMATS.md).
struct ParsedName {
  std::string_view name;
  std::vector<std::pair<std::string_view, std::string_view>> args;
};
ParsedName ParseTraceMeName(std::string_view encoded);

// Adds a textual argument value as the reference does: int64, else uint64,
// else double, else an interned string.
model::Stat StatFromText(model::Plane& plane, std::string_view key, std::string_view value);

}  // namespace spyglass::internal
