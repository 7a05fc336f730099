// Differential fuzzing of the wire-decoding XSpace import (what `spyglass
// collect` runs on a server's reply, and the profile readers on a file)
// against the one-shot protobuf import: both must agree on whether the bytes
// parse, and on the trace they give.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "export/trace_json/trace_json_writer.h"
#include "model/xspace_import.h"
#include "model/xspace_import_chunked.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t chunk = 1 + data[0] % 64;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  spyglass::model::Space whole, pieces;
  spyglass::Status once = spyglass::model::ImportXSpaceBytes(bytes, &whole);
  spyglass::Status chunked = spyglass::model::ImportXSpaceBytesChunked(bytes, &pieces, chunk);
  if (once.ok() != chunked.ok()) {
    std::fprintf(stderr, "one-shot %s, chunked %s\n", once.ToString().c_str(), chunked.ToString().c_str());
    std::abort();
  }
  if (once.ok() && spyglass::exporter::TraceJsonString(whole) != spyglass::exporter::TraceJsonString(pieces)) {
    std::fprintf(stderr, "the chunked import gives another trace\n");
    std::abort();
  }
  return 0;
}
