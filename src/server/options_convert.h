// ProfileOptions between the wire (tensorflow.ProfileOptions) and the library.
#pragma once

#include "profiler_options.pb.h"
#include "spyglass/options.h"

namespace spyglass::server {

// The wire form; version is always 1 (a version-0 request makes a JAX server
// ignore the levels).
tensorflow::ProfileOptions ToProto(const profiler::ProfileOptions& o);

// The library form. version 0 means "defaults" (as the reference server does).
profiler::ProfileOptions FromProto(const tensorflow::ProfileOptions& p);

}  // namespace spyglass::server
