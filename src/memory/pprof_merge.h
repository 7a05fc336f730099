// One memory profile out of several: the samples of each, their stacks and
// `kind`/`device` labels kept, in the form of our snapshots (pprof.h). Used
// where another allocator keeps its own heap profile beside our tracker: in
// a JAX program, spyglass.profiler.device_memory_profile joins PJRT's live
// buffers and executables (jaxlib's heap_profile) to ours.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::memory {

// `profiles`: serialized pprof Profiles, gzipped or not, each with the sample
// types allocations/count and space/bytes (any order; a profile with a single
// space/bytes type counts one allocation per sample). `out`: the gzipped
// merge. Comments are kept, in order; the time is the first profile's.
// Labels other than kind and device are dropped (our profiles have no others).
Status MergePprof(const std::vector<std::string_view>& profiles, std::string* out);

}  // namespace spyglass::memory
