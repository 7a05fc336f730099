// Converts recorder ticks (TSC, or CLOCK_MONOTONIC ns where the TSC is not
// invariant) to nanoseconds, and reads the wall clock for absolute times.
#pragma once

#include <cstdint>

#include "spyglass/internal/recorder.h"  // monotonic_ns(), now_ticks()

namespace spyglass::internal {

uint64_t wall_ns();  // CLOCK_REALTIME, ns since the Unix epoch

// A linear map ticks -> ns, measured between two (ticks, monotonic ns)
// pairs: the process start (or first use) and now. The longer the span, the
// better; Calibrate() waits until it is at least `min_span_ns`.
class TickConverter {
 public:
  static TickConverter Calibrate(uint64_t min_span_ns = 20'000'000);
  // Nanoseconds between two tick readings (b >= a).
  int64_t ns_between(uint64_t a, uint64_t b) const {
    return static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(b - a)) * ns_per_tick_);
  }
  double ns_per_tick() const { return ns_per_tick_; }

 private:
  double ns_per_tick_ = 1.0;
};

// Decides g_state.use_tsc (invariant TSC present) once per process.
void init_clock();

}  // namespace spyglass::internal
