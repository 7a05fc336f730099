// Writes the model as Chrome trace-event JSON, gzip-compressed
// (<host>.trace.json.gz as JAX writes it; perfetto_trace.json.gz is the same
// without the top-level "metadata" object, which Perfetto's importer rejects).
#pragma once

#include <string>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

struct TraceJsonOptions {
  bool perfetto = false;  // omit "metadata"
  int gzip_level = 1;     // zlib level; 1 keeps export at the speed of event production
};

// The host plane is pid 701, as in tsl's exporter; device planes 1 + id.
inline constexpr int kHostPid = 701;

// Writes <path> (or `name` in `dir`) as every output is written (output_file.h).
Status WriteTraceJsonGz(const model::Space& space, const std::string& path, const TraceJsonOptions& options = {});
Status WriteTraceJsonGz(const model::Space& space, const OutputDir& dir, const std::string& name,
                        const TraceJsonOptions& options = {});
// Uncompressed, for tests.
std::string TraceJsonString(const model::Space& space, const TraceJsonOptions& options = {});

}  // namespace spyglass::exporter
