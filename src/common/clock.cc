#include "common/clock.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "spyglass/internal/recorder.h"

namespace spyglass::internal {

uint64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

namespace {

bool has_invariant_tsc() {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0)
      return line.find(" constant_tsc") != std::string::npos && line.find(" nonstop_tsc") != std::string::npos;
  }
  return false;
#else
  return true;  // aarch64: the generic timer counter is invariant
#endif
}

struct Anchor {
  uint64_t ticks;
  uint64_t mono;
};

// The first calibration point, taken when the library loads.
Anchor& first_anchor() {
  static Anchor a = [] {
    init_clock();
    return Anchor{now_ticks(), monotonic_ns()};
  }();
  return a;
}

[[maybe_unused]] const bool g_anchor_taken = (first_anchor(), true);

}  // namespace

void init_clock() {
  static const bool once = [] {
    g_state.use_tsc = has_invariant_tsc();
    return true;
  }();
  (void)once;
}

TickConverter TickConverter::Calibrate(uint64_t min_span_ns) {
  TickConverter c;
#if defined(__x86_64__)
  if (!g_state.use_tsc) return c;  // ticks already are ns
#endif
  const Anchor& a = first_anchor();
  while (monotonic_ns() - a.mono < min_span_ns) usleep(1000);
  uint64_t t = now_ticks();
  uint64_t m = monotonic_ns();
  if (t > a.ticks) c.ns_per_tick_ = static_cast<double>(m - a.mono) / static_cast<double>(t - a.ticks);
  return c;
}

}  // namespace spyglass::internal
