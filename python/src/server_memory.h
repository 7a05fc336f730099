// Bindings of the profiler server, the capture client and memory profiles.
#pragma once

#include <nanobind/nanobind.h>

namespace spyglass::python {

void BindServerAndMemory(nanobind::module_& m);

}  // namespace spyglass::python
