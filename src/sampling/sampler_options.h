// The CPU sampler's options (advanced_configuration keys), registered with
// its tracer (cpu_tracer.cc):
//   spyglass_cpu_sample_hz    samples per second of each thread's CPU time;
//                             0 (the default): no sampling. At most
//                             /proc/sys/kernel/perf_event_max_sample_rate.
//                             `spyglass run --sample` without a rate uses
//                             kDefaultSampleHz.
//   spyglass_cpu_sample_mode  "cpu" (default) or "wall".
#pragma once

#include <cstdint>

#include "sampling/cpu_sampler.h"
#include "session/tracer.h"
#include "spyglass/options.h"

namespace spyglass::sampling {

// 99 Hz: the sampler's cost stays under 1% of the workload's time there
// (BENCHMARKS.md "CPU sampling"), and an off-by-one with periodic work at
// round rates is avoided (perf's and py-spy's habit too).
inline constexpr uint64_t kDefaultSampleHz = 99;

struct SamplerOptions {
  uint64_t hz = 0;
  SampleMode mode = SampleMode::kCpu;
};

session::TracerOptionSpec SamplerOptionSpec();
// The values (after ValidateOptions succeeded).
SamplerOptions ParseSamplerOptions(const profiler::ProfileOptions& options);

}  // namespace spyglass::sampling
