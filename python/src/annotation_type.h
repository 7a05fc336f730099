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

// For the Python tracer, at a yield: ends the annotation's event now (its
// __exit__ then ends nothing), and at the resume begins it again under
// `name` on the calling thread (false: nothing recorded).
void AnnotationPause(PyObject* annotation);
bool AnnotationResume(PyObject* annotation, PyObject* name);

}  // namespace spyglass::python
