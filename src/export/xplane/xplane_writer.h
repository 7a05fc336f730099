// Writes the model as a serialized tensorflow.profiler.XSpace (.xplane.pb).
// To a file it streams (measured first): peak memory is the model plus a
// small output buffer.
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

// Protobuf parses no message of more than INT_MAX bytes (the generated
// classes, XProf, TensorBoard): a bigger XSpace would be a file no tool opens.
inline constexpr uint64_t kMaxXSpaceBytes = INT_MAX;

struct XSpaceWriteOptions {
  // An XSpace that would pass this is cut instead: the events from one time
  // on (the same on every line) are left out so that the rest fits, each
  // plane that lost events counts them in its stat
  // "dropped_events_over_size_limit", and a warning says so in the XSpace
  // and on stderr. A parameter for tests; the default is protobuf's limit.
  uint64_t max_bytes = kMaxXSpaceBytes;
};

Status WriteXSpaceFile(const model::Space& space, const std::string& path, const XSpaceWriteOptions& options = {});
Status WriteXSpaceFile(const model::Space& space, const OutputDir& dir, const std::string& name,
                       const XSpaceWriteOptions& options = {});
// In memory, in one pass (no sizing walk over the events first); a space
// over the limit is then measured and cut as the file writers do.
Status SerializeXSpace(const model::Space& space, std::string* out, const XSpaceWriteOptions& options = {});
// As above with the default limit; empty (and an error on stderr) only when
// even an XSpace without events would pass it.
std::string SerializeXSpace(const model::Space& space);

}  // namespace spyglass::exporter
