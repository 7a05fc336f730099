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

// 99 Hz: there the sampler's cost is within the run-to-run noise (±2% on
// the shared VM of BENCHMARKS.md "CPU sampling"; 999 Hz: ~2%, 4 kHz: ~8%,
// as perf's), and a rate that is not round does not beat in step with
// periodic work (perf's habit too).
inline constexpr uint64_t kDefaultSampleHz = 99;

struct SamplerOptions {
  uint64_t hz = 0;
  SampleMode mode = SampleMode::kCpu;
};

session::TracerOptionSpec SamplerOptionSpec();
// The values (after ValidateOptions succeeded).
SamplerOptions ParseSamplerOptions(const profiler::ProfileOptions& options);

}  // namespace spyglass::sampling
