// Reads a tensorflow.profiler.XSpace message (e.g. from a remote capture or a
// subprocess) into the model, so that the exporters and merges work on it.
#pragma once

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

// Parses serialized XSpace bytes; InvalidArgument if they do not parse.
Status ImportXSpaceBytes(const std::string& bytes, Space* out);

}  // namespace spyglass::model
