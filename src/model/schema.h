// The names of the profile model's schema, in one place: planes, lines and
// stats that XProf, TensorBoard, Perfetto or our own readers give a meaning
// to (spec FORMATS.md; XProf's xplane_schema). Writers and readers use these
// constants, never their own string literals.
#pragma once

#include <string_view>

namespace spyglass::model {

// Planes.
inline constexpr std::string_view kHostPlaneName = "/host:CPU";
inline constexpr std::string_view kMetadataPlaneName = "/host:metadata";
inline constexpr std::string_view kTaskEnvPlaneName = "Task Environment";
inline constexpr std::string_view kGpuPlanePrefix = "/device:GPU:";
inline constexpr std::string_view kTpuPlanePrefix = "/device:TPU:";
inline constexpr std::string_view kCustomPlanePrefix = "/device:CUSTOM:";
inline constexpr std::string_view kDevicePlanePrefix = "/device:";  // every device plane
// A host plane merged from another process or host: "/host:CPU [<tag>]".
inline constexpr std::string_view kMergedHostPlanePrefix = "/host:CPU [";

// Lines.
inline constexpr std::string_view kCounterLineName = "_counters_";  // counter tracks (e.g. live bytes)
// Device lines with activity (spec GPU.md 4.2): a GPU stream "Stream #<id>(<types>)"; XLA's ops line.
inline constexpr std::string_view kStreamLinePrefix = "Stream #";
inline constexpr std::string_view kXlaOpsLineName = "XLA Ops";
// Device event names of copies (GPU.md 4.2): MemcpyH2D, MemcpyD2H, ..., "Memset <kind>".
inline constexpr std::string_view kMemcpyEventPrefix = "Memcpy";
inline constexpr std::string_view kMemsetEventPrefix = "Memset";

// Stats of a plane.
inline constexpr std::string_view kProcessIdStat = "process_id";      // every plane of a session
inline constexpr std::string_view kProcessNameStat = "process_name";  // the host plane
inline constexpr std::string_view kDroppedEventsStat = "dropped_events";
// Flight recorder: host events its ring overwrote since it started.
inline constexpr std::string_view kOverwrittenEventsStat = "overwritten_events";
// Events left out of an .xplane.pb that would pass protobuf's 2 GB limit.
inline constexpr std::string_view kDroppedOverSizeLimitStat = "dropped_events_over_size_limit";
// Stats of the Task Environment plane: the session's wall-clock bounds (ns).
inline constexpr std::string_view kProfileStartTimeStat = "profile_start_time";
inline constexpr std::string_view kProfileStopTimeStat = "profile_stop_time";

// Stats of an event.
inline constexpr std::string_view kIncompleteStat = "incomplete";  // still open at stop, closed there
inline constexpr std::string_view kLiveBytesStat = "live_bytes";   // on counter events of memory
inline constexpr std::string_view kStepNumStat = "step_num";       // a step (StepTraceAnnotation)

// Stats of the /host:metadata plane (besides the user's set_metadata keys).
inline constexpr std::string_view kVersionMetadata = "spyglass_version";
// The file format's version (int64): readers refuse a newer one (spyglass/profile_reader.h).
inline constexpr std::string_view kFormatVersionMetadata = "spyglass_format_version";
inline constexpr std::string_view kHostnameMetadata = "hostname";
inline constexpr std::string_view kPidMetadata = "pid";
inline constexpr std::string_view kCommandLineMetadata = "command_line";
inline constexpr std::string_view kStartTimeMetadata = "start_time_ns";
inline constexpr std::string_view kJaxVersionMetadata = "jax_version";  // set by JAX

// GPU device planes and launch events (spec GPU.md §4; XProf's names).
inline constexpr std::string_view kCorrelationIdStat = "correlation_id";  // uint64: launch <-> device event
inline constexpr std::string_view kContextIdStat = "context_id";
inline constexpr std::string_view kDeviceIdStat = "device_id";
inline constexpr std::string_view kKernelDetailsStat = "kernel_details";
inline constexpr std::string_view kMemcpyDetailsStat = "memcpy_details";
inline constexpr std::string_view kMemsetDetailsStat = "Memset_details";
inline constexpr std::string_view kMemallocDetailsStat = "memalloc_details";
inline constexpr std::string_view kCudaGraphIdStat = "cuda_graph_id";
inline constexpr std::string_view kCudaGraphExecIdStat = "cuda_graph_exec_id";
// gpu_dump_graph_node_mapping: the node of a graph's kernel/copy, the call
// that made the node (cuGraphAddKernelNode, or cuLaunchKernel under stream
// capture), and the node a clone (instantiation) was made from.
inline constexpr std::string_view kCudaGraphNodeIdStat = "cuda_graph_node_id";
inline constexpr std::string_view kCudaGraphNodeApiStat = "cuda_graph_node_api";
inline constexpr std::string_view kCudaGraphOrigNodeIdStat = "cuda_graph_orig_node_id";
inline constexpr std::string_view kCudaGraphNodeTypeStat = "cuda_graph_node_type";
inline constexpr std::string_view kCudaGraphNodeMapPrefix = "CudaGraphNodeMap: ";  // host event per node made
inline constexpr std::string_view kTfOpStat = "tf_op";  // outermost annotation open at launch
inline constexpr std::string_view kAnnotationStackStat = "annotation_stack";  // all of them, outer::inner
inline constexpr std::string_view kDeviceVendorStat = "device_vendor";
inline constexpr std::string_view kGpuDeviceNameStat = "gpu_device_name";
inline constexpr std::string_view kGpuClockRateStat = "clock_rate";  // kHz
inline constexpr std::string_view kGpuCoreCountStat = "core_count";  // SMs
inline constexpr std::string_view kGpuMemoryBandwidthStat = "memory_bandwidth";  // bytes/s
inline constexpr std::string_view kGpuMemorySizeStat = "memory_size";
inline constexpr std::string_view kGpuComputeCapMajorStat = "compute_cap_major";
inline constexpr std::string_view kGpuComputeCapMinorStat = "compute_cap_minor";
// Ours: the CUPTI -> host clock map of the session (samples, error bound, slope).
inline constexpr std::string_view kGpuClockSamplesStat = "clock_samples";
inline constexpr std::string_view kGpuClockBoundStat = "clock_bound_ns";
inline constexpr std::string_view kGpuClockSlopeStat = "clock_slope";

}  // namespace spyglass::model
