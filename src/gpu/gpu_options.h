// The GPU keys of ProfileOptions.advanced_configuration (spec GPU.md §1.4):
// their ranges, checked by ValidateOptions, and their values for the tracer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "session/tracer.h"
#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::gpu {

// Bound on gpu_max_callback_api_events (and what 0, "no limit", means): the
// host-call array is reserved up front (48 bytes an event, pages committed as used).
inline constexpr int64_t kMaxCallbackEvents = int64_t{1} << 26;
inline constexpr int64_t kMaxActivityEvents = int64_t{1} << 31;

struct GpuOptions {
  int64_t max_callback_api_events = 2 * 1024 * 1024;
  int64_t max_activity_api_events = 2 * 1024 * 1024;
  int64_t max_annotation_strings = 1024 * 1024;
  bool enable_nvtx_tracking = false;
  bool enable_activity_graph_trace = false;
  bool dump_graph_node_mapping = false;
  std::vector<std::string> pm_sample_counters;
  int64_t pm_sample_interval_us = 500;
  int64_t pm_sample_buffer_size_per_gpu_mb = 64;
  int64_t num_chips_to_profile_per_task = 0;  // 0: all
  bool any_gpu_key = false;                   // the user set a gpu_* key
};

// The gpu_* keys and their checks, registered with the GPU tracer
// (gpu_tracer.cc): ValidateOptions accepts them and runs ValidateGpuOptions.
session::TracerOptionSpec GpuOptionSpec();
// Range checks of the gpu_* keys (their types are checked by ValidateOptions
// from GpuOptionSpec's keys).
Status ValidateGpuOptions(const profiler::ProfileOptions& options);
// The values (call after ValidateGpuOptions succeeded).
GpuOptions ParseGpuOptions(const profiler::ProfileOptions& options);

// One CUPTI subscriber per process: where another profiler of the process
// traces the device itself (XLA's device tracer in a JAX process, which
// knows the HLO op of each kernel), our GPU tracer steps aside. The probe
// names that profiler, "" when there is none; it is asked at each session's
// creation, with the session's options, without the GIL (the Python package
// sets it: xla_plugin.cc).
using DeviceOwnerProbe = std::string (*)(const profiler::ProfileOptions& options);
void SetDeviceOwnerProbe(DeviceOwnerProbe probe);
// Whether a GPU tracer of ours holds CUPTI now (between its start and stop):
// a profiler starting later leaves the device to it.
bool GpuTracerActive();

}  // namespace spyglass::gpu
