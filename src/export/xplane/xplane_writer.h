// Writes the model as a serialized tensorflow.profiler.XSpace (.xplane.pb),
// streaming: peak memory is the model plus a small output buffer.
#pragma once

#include <string>

#include "export/output_file.h"
#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::exporter {

Status WriteXSpaceFile(const model::Space& space, const std::string& path);
Status WriteXSpaceFile(const model::Space& space, const OutputDir& dir, const std::string& name);
std::string SerializeXSpace(const model::Space& space);

}  // namespace spyglass::exporter
