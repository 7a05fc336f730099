// The one export step: a model to every requested format, as files in one
// run directory opened once (output_file.h: no symbolic link followed, each
// file renamed into place when complete). stop_trace / export_last_trace,
// `spyglass collect` and the profiler server (when it writes the file
// itself) all export through it. A new format is one converter (a folder
// under src/export/) plus one entry in kFormats (export.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

enum class Format {
  kXPlane,              // <host>.xplane.pb: the XSpace, for XProf / TensorBoard
  kTraceJson,           // <host>.trace.json.gz: trace-event JSON, as JAX writes it
  kPerfettoTraceJson,   // perfetto_trace.json.gz: the same without "metadata" (Perfetto rejects it)
};

struct ExportRequest {
  std::vector<Format> formats;
  // The file stem of the per-host formats (a plain name: a host, host_port).
  std::string host;
  // The model already serialized as an XSpace (a server's reply): written as
  // received for kXPlane instead of serializing the model again.
  std::string_view xplane_bytes;
};

// Where each requested format was written (empty when not requested).
struct ExportedFiles {
  std::string xplane;
  std::string trace_json;
  std::string perfetto_trace;
  // With kXPlane or kTraceJson: cpu.<pid>.<comm>.prof of each process the
  // model has CPU samples of (src/sampling/cpu_model.h).
  std::vector<std::string> cpu_profiles;
};

// The file name of `format` for `host` ("vm.xplane.pb", "perfetto_trace.json.gz").
std::string FileNameOf(Format format, const std::string& host);

// Writes each format of `request` into `dir`, in order; stops at the first
// error (the files written before it stay, complete).
Status Export(const model::Space& space, const OutputDir& dir, const ExportRequest& request, ExportedFiles* files);

}  // namespace spyglass::exporter
