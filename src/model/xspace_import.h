// Reads a tensorflow.profiler.XSpace message (e.g. from a remote capture or a
// subprocess) into the model, so that the exporters and merges work on it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

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

// Protobuf refuses a whole XSpace for one string field (a name, a stat's
// str_value) that is not UTF-8, where `spyglass summary` reads the file:
// `out` gets a copy of `bytes` with each such string made valid (a bad byte
// becomes U+FFFD, as ValidUtf8), *replaced how many strings changed. False
// if the bytes do not parse as protobuf wire format.
bool ScrubInvalidUtf8(std::string_view bytes, std::string* out, size_t* replaced);
// The warning an import adds when it read a scrubbed copy.
std::string InvalidUtf8Warning(size_t replaced);

}  // namespace spyglass::model
