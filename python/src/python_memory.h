// Memory tracking with Python stacks: buffers a user registers and numpy
// arrays (through numpy's data-memory handler), recorded with the allocating
// Python stack (function, file, line) as symbolic frames.
#pragma once

#include <Python.h>

namespace spyglass::python {

// Adds record_allocation, record_free, track_numpy, numpy_tracking,
// _numpy_hook_state and tracking_stats to the module. False with a Python
// error set on failure.
bool AddPythonMemory(PyObject* module);

}  // namespace spyglass::python
