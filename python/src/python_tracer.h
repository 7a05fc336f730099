// The Python function tracer: a session::Tracer that records every Python
// function call and return (and C function calls) as events on the calling
// thread's timeline, through the same recorder as the annotations.
#pragma once

#include <Python.h>

namespace spyglass::python {

// Registers the tracer (session/tracer.h, rank kRankPython: sessions with
// python_tracer_level >= 1 get one) and adds its helpers to `module`. Call
// once, with the GIL.
bool RegisterPythonTracer(PyObject* module);

// In a forked child: removes the hooks the parent's session installed.
void PythonTracerAfterForkChild();

}  // namespace spyglass::python
