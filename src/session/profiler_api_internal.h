// What the Python package's ProfileSession / ProfileData need beyond the
// public API (spyglass/profiler.h): the last stopped trace's model, shared
// instead of copied, and the export step of profiler_api.cc for any model.
#pragma once

#include <memory>
#include <string>

#include "model/xspace.h"
#include "spyglass/profiler.h"

namespace spyglass::session {

// The model of the last stopped trace (null before the first stop).
std::shared_ptr<const model::Space> LastTraceSpace();

// Stops the session as stop_trace does, but writes nothing whatever its log
// dir: jax's stop_and_get_fdo_profile and PGLE read the trace from memory
// (LastTraceSpace) and leave no run behind.
Status StopTraceInMemory();

// Writes `space` as stop_trace writes a trace: <log_dir>/plugins/profile/<run>/
// (the run named by options.profiler_options.session_id, else the time),
// <host>.xplane.pb and <host>.trace.json.gz, and perfetto_trace.pb
// served once when asked; last_trace_files() then names them.
Status ExportSpace(const model::Space& space, const std::string& log_dir, const profiler::TraceOptions& options);

}  // namespace spyglass::session
