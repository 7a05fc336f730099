// The TraceAnnotation / StepTraceAnnotation types of spyglass._spyglass.
#pragma once

#include <Python.h>

namespace spyglass::python {

// Adds both types to `module`; false with a Python error set on failure.
bool AddAnnotationTypes(PyObject* module);

// Whether `ml` is a method of those types (__enter__/__exit__/set_metadata):
// the Python tracer does not record them, since they begin and end events
// themselves.
bool IsAnnotationMethod(const PyMethodDef* ml);

}  // namespace spyglass::python
