// CPU samples in the profile model (docs/sampling.md has the layout), and
// the per-process pprof CPU profile the export step writes from it.
//
// On the process's host plane ("/host:CPU", or "/host:CPU [<tag>]" merged):
//   - one line per sampled thread: id kCpuSampleLineIdBase + tid, name
//     kCpuSamplesLineName, display_name "<thread name> <tid> CPU samples";
//   - one event per sample: offset the sample's time, duration the CPU time
//     it stands for (the period), metadata the innermost node of its stack;
//     stat kAnnotationStackStat ("annotation_stack", outer::inner, a ref) when
//     an annotation was open on its thread then;
//   - a stack is a chain of nodes, one EventMetadata each (a trie: stacks
//     share their outer nodes): name "cpu_stack#<n>", display_name the
//     frame's function (what timelines show), stats kCpuFrameStat (function,
//     ref), kCpuFileStat (ref), kCpuLineStat (int), kCpuAddressStat (uint,
//     module-relative), kCpuParentStat (uint: the caller's node's metadata
//     id; absent at the outermost node), kCpuFrameKindStat (ref: "native",
//     or "python" for a Python function's frame: file and line its code's,
//     no address; python_stacks.h puts them among the native frames);
//   - plane stats: kCpuSampleCountStat, kCpuSamplePeriodStat (ns),
//     kCpuSampleModeStat, kCpuSampleMechanismStat, kCpuSamplesLostStat,
//     kCpuSamplesDroppedStat, kCpuStacksTruncatedStat; the sampler's own
//     cost: kCpuUnwindNsStat, kCpuReaderCpuNsStat.
// A truncated stack has an outermost node "[truncated]".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "export/output_file.h"
#include "model/xspace.h"
#include "sampling/cpu_sampler.h"
#include "spyglass/status.h"

namespace spyglass::sampling {

inline constexpr int64_t kCpuSampleLineIdBase = int64_t{1} << 32;
inline constexpr std::string_view kCpuSamplesLineName = "CPU samples";
inline constexpr std::string_view kCpuStackNodePrefix = "cpu_stack#";
inline constexpr std::string_view kCpuFrameStat = "cpu_frame";
inline constexpr std::string_view kCpuFileStat = "cpu_frame_file";
inline constexpr std::string_view kCpuLineStat = "cpu_frame_line";
inline constexpr std::string_view kCpuAddressStat = "cpu_frame_address";
inline constexpr std::string_view kCpuParentStat = "cpu_stack_parent";
inline constexpr std::string_view kCpuFrameKindStat = "cpu_frame_kind";
inline constexpr std::string_view kCpuSampleCountStat = "cpu_samples";
inline constexpr std::string_view kCpuSamplePeriodStat = "cpu_sample_period_ns";
inline constexpr std::string_view kCpuSampleModeStat = "cpu_sample_mode";
inline constexpr std::string_view kCpuSampleMechanismStat = "cpu_sample_mechanism";
inline constexpr std::string_view kCpuSamplesLostStat = "cpu_samples_lost";
inline constexpr std::string_view kCpuSamplesDroppedStat = "cpu_samples_dropped";
inline constexpr std::string_view kCpuStacksTruncatedStat = "cpu_stacks_truncated";
inline constexpr std::string_view kCpuUnwindNsStat = "cpu_sampler_unwind_ns";
inline constexpr std::string_view kCpuReaderCpuNsStat = "cpu_sampler_reader_cpu_ns";
inline constexpr std::string_view kTruncatedFrame = "[truncated]";
// A plane stat (string) that holds the stack trie by node name, one node a
// line: "<name>\t<parent name>\t<kind>\t<address>\t<line>\t<function>\t<file>".
// Written for planes that another profiler merges into its own (XLA's
// plugin API: its merge copies a plane's stats and each sampled event's
// metadata by name, so that metadata ids, kCpuParentStat, and the nodes no
// sample ends in are lost). Where it is present, stacks are read from it.
inline constexpr std::string_view kCpuStackTableStat = "cpu_stack_table";

// Writes `cap` onto `host` (the layout above): symbolizes its stacks (the
// process must still have the modules mapped), and gives each sample the
// annotations open on its thread's host line. `start_mono_ns`: the
// CLOCK_MONOTONIC time of offset 0.
void AddSamplesToPlane(CpuCapture cap, uint64_t start_mono_ns, SampleMode mode, model::Plane* host);

// Makes `host`'s samples survive a merge by event name into another plane
// (kCpuStackTableStat): the table written, kCpuParentStat taken off the
// nodes. Nothing is done to a plane without samples.
void MakeCpuStacksPortable(model::Plane* host);

// A stack of the model read back, innermost first.
struct ModelFrame {
  std::string_view function, file;
  int64_t line = 0;
  uint64_t address = 0;
  bool python = false;  // kCpuFrameKindStat "python"
};
// The frames of node `leaf` (an event's metadata id) of `plane`.
std::vector<ModelFrame> StackOfNode(const model::Plane& plane, uint32_t leaf);
// The frame of one node (a valid event metadata id), and in `*parent` its
// caller's node (0: outermost, or a parent id that is not in the plane).
ModelFrame FrameOfNode(const model::Plane& plane, uint32_t node, uint32_t* parent);

// "<prefix>.<pid>.<comm><suffix>" for the process of `host`: its comm cut to
// 64 bytes of [A-Za-z0-9._-] (others become '_'; "process" if none).
std::string ProcessFileName(const model::Plane& host, std::string_view prefix, std::string_view suffix);

// For each host plane with samples: cpu.<pid>.<comm>.prof into `dir`
// (pprof: samples/count, cpu/nanoseconds; labels thread, annotation).
// `written`: the paths.
Status WriteCpuProfiles(const model::Space& space, const exporter::OutputDir& dir, std::vector<std::string>* written);

}  // namespace spyglass::sampling
