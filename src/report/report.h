// `spyglass report`: one self-contained HTML file (scripts, styles and data
// inline; nothing fetched) with the step-time chart, the summary tables, a
// zoomable timeline of the threads and GPU streams, and a flame graph of each
// memory profile. The page's code is src/report/web/, compiled in.
#pragma once

#include <string>
#include <vector>

#include "report/flame.h"
#include "report/timeline.h"

namespace spyglass::report {

struct ReportInput {
  std::string title;          // what was read (shown as the heading)
  Timeline timeline;
  std::string summary_json;   // the analysis summary as JSON ("" if none)
  std::vector<FlameGraph> flames;
  std::vector<std::string> notes;  // shown under the heading (e.g. profiles that could not be read)
};

// The HTML page. The timeline's levels (at most twice the events, a few
// bytes each) are gzipped and base64-encoded into it.
std::string RenderReport(const ReportInput& in);

}  // namespace spyglass::report
