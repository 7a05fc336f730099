// Writes the model as a native Perfetto trace (perfetto_trace.pb): a stream
// of TracePacket records (spec PERFETTO.md), which the Perfetto UI and
// trace_processor load without the limits of their JSON importer (names are
// interned once instead of repeated per event; no document to parse whole).
//
// What goes in:
//   - one process track per plane with events (host: the recorded pid; a
//     device plane: a pid of its own above any real one), one thread track
//     per line; a line whose events overlap without nesting spills the
//     overlapping ones onto extra tracks beside the thread (BEGIN/END must
//     nest on a track);
//   - each event as a slice (TYPE_SLICE_BEGIN/END, TYPE_INSTANT when it lasts
//     less than a nanosecond), its name interned (InternedData.event_names),
//     its stats as debug annotations (names interned), all names defined
//     once at the start;
//   - flows: a GPU launch and its device events (same correlation_id in one
//     process), producer/consumer pairs (_pt/_p with _ct/_c);
//   - the counter line ("_counters_") as counter tracks under the process,
//     with units (live_bytes: bytes);
//   - the CPU sampler's samples (the "CPU samples" lines, sampling/cpu_model.h)
//     as PerfSample packets on their process and thread, on a sequence of
//     their own whose head interns every function, source file, frame (one
//     per stack node, Python frames KIND_INTERPRETED) and callstack: the UI
//     shows them on their threads and a flame graph of a selected range
//     (trace_processor's perf_sample table), not as slices;
//   - the recorder's drops as TraceStats (the UI's data-loss flag).
// Timestamps are the model's nanoseconds as they are, in the trace's own
// clock (no ClockSnapshot: no packet names a clock), so they line up with
// the .xplane.pb and the trace JSON of the same run.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

struct PerfettoTraceOptions {
  // Threads that encode slices of the trace in parallel (written in order);
  // 0: one per core, at most kMaxPerfettoTraceThreads.
  int threads = 0;
};
inline constexpr int kMaxPerfettoTraceThreads = 4;

// Streams the trace to `sink` in blocks of about 1 MiB, on the calling
// thread (memory stays at one block whatever the model's size); stops when
// `sink` returns false and returns false then.
bool StreamPerfettoTrace(const model::Space& space, const std::function<bool(std::string_view)>& sink);

// Writes <path> (or `name` in `dir`) as every output is written
// (output_file.h). Memory: 2 blocks per thread in flight.
Status WritePerfettoTrace(const model::Space& space, const std::string& path,
                          const PerfettoTraceOptions& options = {});
Status WritePerfettoTrace(const model::Space& space, const OutputDir& dir, const std::string& name,
                          const PerfettoTraceOptions& options = {});

// In memory, for tests.
std::string PerfettoTraceString(const model::Space& space);

}  // namespace spyglass::exporter
