// Spyglass and XLA's profiler in one trace (docs/jax-plugin.md).
//
// One way: an XLA profiler plugin, through XLA's public C API
// (PLUGIN_Profiler_Api, handed to jaxlib's register_plugin_profiler inside a
// "pjrt_c_api" capsule). Every XLA profiler session (jax.profiler, XProf's
// capture, jax.collect_profile) then starts a Spyglass session too, and our
// planes are merged into XLA's XSpace.
//
// The other way: a Spyglass tracer that, when a Spyglass session starts in a
// JAX process, starts XLA's ProfilerSession (through Python callbacks) and
// merges XLA's planes into our model at the stop. The plugin then stays
// passive: one session of each kind, nothing recorded twice.
#pragma once

#include <nanobind/nanobind.h>

namespace spyglass::python {

void BindXlaPlugin(nanobind::module_& m);

}  // namespace spyglass::python
