// Writes the model as Chrome trace-event JSON, gzip-compressed
// (<host>.trace.json.gz as JAX writes it; perfetto_trace.json.gz is a second
// name of the same file: Perfetto's JSON importer skips "metadata").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

struct TraceJsonOptions {
  bool perfetto = false;  // omit "metadata" (as JAX's perfetto_trace.json.gz; Perfetto needs no such change)
  // 1-3 (below 1 counts as 1): ISA-L's igzip at that level, ~1 GB/s per core
  // at 1, so that export keeps up with formatting; 4-9: zlib at that level
  // (smaller files, about 5x slower).
  int gzip_level = 1;
  bool zlib = false;  // zlib at every level (benchmarks compare the two)
  // Threads that format and compress slices of the document in parallel;
  // 0: one per core, at most kMaxTraceJsonThreads.
  int threads = 0;
};
inline constexpr int kMaxTraceJsonThreads = 4;

// The host plane is pid 701, as in tsl's exporter; device planes 1 + id.
inline constexpr int kHostPid = 701;

// One gzip member (one header, one deflate stream, one trailer: Perfetto's
// importer stops at the end of the first member). Memory stays bounded: a
// fixed number of ~1 MiB slices are in flight, written in document order.
// Writes <path> (or `name` in `dir`) as every output is written (output_file.h).
Status WriteTraceJsonGz(const model::Space& space, const std::string& path, const TraceJsonOptions& options = {});
Status WriteTraceJsonGz(const model::Space& space, const OutputDir& dir, const std::string& name,
                        const TraceJsonOptions& options = {});

// The uncompressed JSON, in order, in blocks of about 1 MiB; stops when
// `sink` returns false and returns false then.
bool StreamTraceJson(const model::Space& space, const TraceJsonOptions& options,
                     const std::function<bool(std::string_view)>& sink);
// The size of the uncompressed JSON, estimated from the model; counting stops
// once it passes `stop_above`. Trace JSON repeats an event's name and stats
// for every event (the format has no string table), so a small model with
// long names can make a huge file: callers writing JSON for a model they did
// not record (a server's reply) check this first.
uint64_t EstimateTraceJsonBytes(const model::Space& space, uint64_t stop_above = UINT64_MAX);

// Uncompressed, for tests.
std::string TraceJsonString(const model::Space& space, const TraceJsonOptions& options = {});

}  // namespace spyglass::exporter
