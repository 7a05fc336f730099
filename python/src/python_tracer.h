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

// Which hook records now: "sys.monitoring", "setprofile" or "off".
const char* PythonTracerHook();

// For TraceAnnotation (annotation_type.cc), with the GIL: while the tracer
// runs, an annotation's begin and end are reported, so that one still open
// when its frame yields or ends is ended there (and begun again at resume).
extern bool g_tracer_follows_annotations;
void PythonTracerFollowAnnotation(PyObject* annotation, PyObject* name);
void PythonTracerUnfollowAnnotation(PyObject* annotation);

}  // namespace spyglass::python
