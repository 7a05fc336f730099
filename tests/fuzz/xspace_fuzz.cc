// Fuzz target: bytes through ImportXSpaceBytes, then the exporters that read
// the model (trace JSON, XSpace); what our writer produces must read back.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace_import.h"

#include <google/protobuf/stubs/logging.h>

namespace {

// Protobuf logs every string field that is not UTF-8; mutated inputs have many.
const bool kQuiet = [] {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}();

namespace model = spyglass::model;

// Trace JSON repeats an event's name and stats per event (the format has no
// string table), so its size is events x name length: skip models whose
// export would be larger than this rather than measure the format.
constexpr size_t kMaxExportBytes = size_t{64} << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  model::Space space;
  model::XSpaceImportOptions opts;
  opts.max_bytes = 4 << 20;
  if (!model::ImportXSpaceBytes(bytes, &space, opts).ok()) return 0;
  if (spyglass::exporter::EstimateTraceJsonBytes(space, kMaxExportBytes) > kMaxExportBytes) return 0;
  (void)spyglass::exporter::TraceJsonString(space);
  spyglass::exporter::TraceJsonOptions perfetto;
  perfetto.perfetto = true;
  (void)spyglass::exporter::TraceJsonString(space, perfetto);
  std::string again = spyglass::exporter::SerializeXSpace(space);
  model::Space back;
  if (!model::ImportXSpaceBytes(again, &back).ok()) std::abort();  // our own output must read back
  if (back.planes.size() != space.planes.size()) std::abort();
  return 0;
}
