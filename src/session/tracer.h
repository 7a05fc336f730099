// The one interface every tracer implements (host, python, device, memory,
// subprocesses): start, stop, then write what it saw into the model.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/xspace.h"
#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::session {

class Tracer {
 public:
  virtual ~Tracer() = default;
  virtual Status Start() = 0;
  virtual Status Stop() = 0;
  // Called after Stop, once.
  virtual Status CollectData(model::Space* space) = 0;
};

// Makes a tracer for a session's options, or nullptr when the options turn it
// off. Factories registered here (e.g. by the Python binding) join every
// later session.
using TracerFactory = std::function<std::unique_ptr<Tracer>(const profiler::ProfileOptions&)>;
void RegisterTracerFactory(TracerFactory factory);

}  // namespace spyglass::session
