// `spyglass memtop --over-time`: a memory timeline (memory/timeline.h) as a
// small text chart, plain ASCII: live bytes per device (a bar chart, one
// column per slice of the run, each column the highest value in its slice),
// then the top call sites, one line each (a sparkline scaled to the site's own
// maximum).
#pragma once

#include <cstddef>
#include <string>

#include "memory/timeline.h"

namespace spyglass::memory {

struct TimelineChartOptions {
  size_t width = 60;   // columns of time (10..400)
  size_t height = 8;   // rows of the device charts (2..40)
  size_t top_sites = 8;
};
std::string TimelineChart(const Timeline& t, const std::string& name, const TimelineChartOptions& options = {});

}  // namespace spyglass::memory
