// Status -> Python exception, the one way for the whole extension:
// InvalidArgument raises spyglass.InvalidArgumentError (a ValueError), every
// other code a RuntimeError, as jax.profiler raises. Both carry the code's
// name in `.code` ("FailedPrecondition", "AlreadyExists", ...), so the Python
// layer maps codes to JAX's exception types without reading messages.
#pragma once

#include <nanobind/nanobind.h>

#include "spyglass/status.h"

namespace spyglass::python {

// Creates spyglass.InvalidArgumentError as an attribute of `m`.
void AddErrorTypes(nanobind::module_& m);

[[noreturn]] void Raise(const Status& s);
inline void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// A RuntimeError whatever the code (still in `.code`): reading a profile
// fails as jax's ProfileData does (a file not found, bytes that do not parse).
[[noreturn]] void RaiseRuntimeError(const Status& s);

}  // namespace spyglass::python
