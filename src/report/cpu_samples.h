// The CPU sampler's samples of a run, with their times, for the report's
// flame graph of a selected time range (the CPU profiles' flame graphs,
// from the pprof files, have no times). Read from the run's .xplane.pb:
// the "CPU samples" lines of its host planes (sampling/cpu_model.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "report/timeline.h"
#include "spyglass/status.h"

namespace spyglass::report {

// One process's samples. The stack nodes its samples reach form a tree
// (stacks share their callers): node i's frame is (node_fn[i], node_file[i],
// node_line[i], node_kind[i]: 0 native, 1 Python; names index `strings`)
// and its caller is node node_parent[i] - 1 (0: outermost).
struct CpuSampleSet {
  std::string title;                  // the process ("<comm> <pid>", or the plane's name)
  std::vector<std::string> strings;   // [0]: ""
  std::vector<uint32_t> node_parent, node_fn, node_file;
  std::vector<int64_t> node_line;
  std::vector<uint8_t> node_kind;
  std::vector<std::string> threads;   // "<name> <tid>"
  uint64_t samples = 0;
  uint64_t hidden_samples = 0;        // past kMaxReportSamples: not in the page
  int64_t first_ns = 0;               // the first sample's time (absolute, as the timeline's start_ns)
  // Per sample, in time order, as LEB128 varints: the zigzag gap in ns from
  // the previous sample's time (the first: from first_ns), its innermost
  // node, its thread (index in `threads`), its CPU time in ns.
  std::string encoded;
};

// Samples kept per page (the last ones past it are counted, not kept):
// about 4 bytes each once compressed.
inline constexpr uint64_t kMaxReportSamples = 4'000'000;
inline constexpr size_t kMaxReportStackDepth = 4096;  // frames of a stack (the page stops there too)

// Appends one set per host plane of `path` (a .xplane.pb) that has samples,
// and gives `timeline` each "CPU samples" line, each sample a span named
// after its function (AddProfileFile with `sample_lines` leaves them out);
// `host` as AddProfileFile's. `out` null: the timeline's lines only.
Status AddCpuSamples(const std::string& path, const std::string& host, TimelineBuilder* timeline,
                     std::vector<CpuSampleSet>* out);

}  // namespace spyglass::report
