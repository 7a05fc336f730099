// Writes the model as a serialized tensorflow.profiler.XSpace (.xplane.pb),
// streaming: peak memory is the model plus a small output buffer.
#pragma once

#include <string>

#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

Status WriteXSpaceFile(const model::Space& space, const std::string& path);
std::string SerializeXSpace(const model::Space& space);

}  // namespace spyglass::exporter
