// `spyglass report`: one self-contained HTML file (scripts, styles and data
// inline; nothing fetched) with the step-time chart, the summary tables, a
// zoomable timeline of the threads and GPU streams, and a flame graph of each
// memory profile. The page's code is src/report/web/, compiled in.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "memory/timeline.h"
#include "report/cpu_samples.h"
#include "report/flame.h"
#include "report/timeline.h"

namespace spyglass::report {

inline constexpr uint64_t kMaxPageBytes = 20'000'000;

struct ReportInput {
  std::string title;          // what was read (shown as the heading)
  Timeline timeline;
  std::string summary_json;   // the analysis summary as JSON ("" if none)
  std::vector<FlameGraph> flames;
  std::vector<FlameGraph> cpu_flames;  // BuildCpuFlameGraph: the CPU sampler's profiles (cpu.*.prof)
  // The same samples with their times (AddCpuSamples): a range selected on
  // the timeline shows the flame graph of the samples in it.
  std::vector<CpuSampleSet> cpu_samples;
  // Live bytes over time per device and top call site (memory.*.timeline.tsv):
  // a chart whose range selection shows what was live and allocated in it.
  std::vector<std::pair<std::string, memory::Timeline>> memory_timelines;  // (file name, series)
  std::vector<std::string> notes;  // shown under the heading (e.g. profiles that could not be read)
  // The page's budget: past it the timeline's finest levels are left out
  // (CoarsenTimeline) and the page says so.
  uint64_t max_page_bytes = kMaxPageBytes;
};

// What the page may load: nothing but its own inline code and images.
inline constexpr std::string_view kReportPolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

// The HTML page, under the Content-Security-Policy `policy` (a page served
// by spyglass view also fetches from its server). The timeline's levels (at most twice the events, a few
// bytes each) are gzipped and base64-encoded into it; when the page would
// be larger than in.max_page_bytes, in.timeline is coarsened first.
std::string RenderReport(ReportInput& in, std::string_view policy = kReportPolicy);

}  // namespace spyglass::report
