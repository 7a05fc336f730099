// The CPU samples of each process as a Firefox Profiler profile, in the
// processed profile format that samply writes (preprocessedProfileVersion 54:
// per-thread string arrays), which profiler.firefox.com opens as is:
//   firefox.<pid>.<comm>.json beside the XSpace, one per host plane with samples.
// One thread per sampled thread: its samples (time in ms from the session's
// start, threadCPUDelta in µs: the CPU time each stands for), its stacks
// (stackTable/frameTable/funcTable, frames of category "Native" or "Python",
// file and line in funcTable/frameTable), and the annotations of its host
// line (TraceAnnotation, Python functions of the tracer, steps) as interval
// markers. meta.startTime: the session's wall-clock start.
#pragma once

#include <string>
#include <vector>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::sampling {

// The profile of `host` (a host plane with CPU samples) as JSON; "" without samples.
std::string FirefoxProfileJson(const model::Space& space, const model::Plane& host);

// For each host plane with samples: firefox.<pid>.<comm>.json into `dir`.
Status WriteFirefoxProfiles(const model::Space& space, const exporter::OutputDir& dir,
                            std::vector<std::string>* written);

}  // namespace spyglass::sampling
