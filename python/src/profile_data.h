// jax.profiler's ProfileData, ProfilePlane, ProfileLine and ProfileEvent over
// the model (see profile_data.cc).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "model/xspace.h"

namespace spyglass::python {

void BindProfileData(nanobind::module_& m);

// The model of a ProfileData object (nanobind's cast error for anything else).
std::shared_ptr<const model::Space> SpaceOf(nanobind::handle profile_data);

}  // namespace spyglass::python
