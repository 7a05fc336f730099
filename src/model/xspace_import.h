// Reads a tensorflow.profiler.XSpace message (e.g. from a remote capture or a
// subprocess) into the model, so that the exporters and merges work on it.
#pragma once

#include <cstddef>
#include <string>

#include "model/xspace.h"
#include "spyglass/status.h"

namespace tensorflow::profiler {
class XSpace;
class XPlane;
}  // namespace tensorflow::profiler

namespace spyglass::model {

// Appends the planes of `in` to `out` (and its errors, warnings, hostnames).
// Metadata ids are re-assigned densely (interned by name); events keep their
// times (offset from their line's timestamp).
void ImportXSpace(const tensorflow::profiler::XSpace& in, Space* out);
void ImportXPlane(const tensorflow::profiler::XPlane& in, Plane* out);

// Default bound on serialized XSpace bytes read into the model (parsing
// builds several times that in memory).
inline constexpr size_t kDefaultMaxXSpaceBytes = size_t{1024} << 20;  // 1 GiB

struct XSpaceImportOptions {
  size_t max_bytes = kDefaultMaxXSpaceBytes;
};

// Parses serialized XSpace bytes; InvalidArgument if they do not parse or are
// over options.max_bytes (then `out` is unchanged).
Status ImportXSpaceBytes(const std::string& bytes, Space* out, const XSpaceImportOptions& options = {});

}  // namespace spyglass::model
