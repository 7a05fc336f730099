// JAX's device bytes on the memory timeline (docs/jax.md, "Device memory").
#pragma once

#include <nanobind/nanobind.h>

namespace spyglass::python {

void BindJaxMemory(nanobind::module_& m);

}  // namespace spyglass::python
