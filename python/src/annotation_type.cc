// TraceAnnotation / StepTraceAnnotation as plain CPython types: the `with`
// hot path is a vectorcall constructor and two C methods, with no Python
// frame and no argument-parsing layer in between.
//
//   TraceAnnotation(name, **kwargs)      begins the event at construction when a
//                                        session records level 1, as JAX does
//   __enter__() -> self, __exit__(...)   ends it (returns None: exceptions pass)
//   set_metadata(**kwargs)               adds arguments to the running event
//   TraceAnnotation.is_enabled()         whether a session records annotations
//
// Keyword values become typed event arguments: bool -> 1/0 (int64), int ->
// int64 (beyond int64: its decimal string), float -> double, str -> string,
// anything else -> str(value).
#include "annotation_type.h"

#include <Python.h>

#include "python_tracer.h"

#include <cstring>
#include <string_view>

#include "spyglass/internal/recorder.h"

namespace spyglass::python {
namespace {

namespace in = ::spyglass::internal;

constexpr int kLevel = 1;  // TraceMe level of Python annotations, as in JAX

struct AnnotationObject {
  PyObject_HEAD
  uint64_t word;           // session word of the open event, 0 if none
  in::ThreadBuffer* tb;    // the thread buffer it was begun in
  uint64_t step_begin;     // a step timed for the flight recorder's slow-step dump, else 0
};

PyTypeObject g_annotation_type = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject g_step_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A small free list for the exact TraceAnnotation type (GIL-protected).
constexpr int kFreeListMax = 32;
AnnotationObject* g_free_list[kFreeListMax];
int g_free_count = 0;

inline bool Recording() {
  return static_cast<int>(in::g_state.session_word.load(std::memory_order_relaxed) & 0xff) >= kLevel;
}

bool RecordArg(uint64_t word, PyObject* key, PyObject* value) {
  Py_ssize_t klen;
  const char* k = PyUnicode_AsUTF8AndSize(key, &klen);
  if (k == nullptr) return false;
  std::string_view ks(k, static_cast<size_t>(klen));
  if (PyBool_Check(value)) {
    in::add_arg(word, ks, in::ArgType::kInt64, value == Py_True ? 1 : 0, {});
    return true;
  }
  if (PyLong_Check(value)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0) {
      if (v == -1 && PyErr_Occurred()) return false;
      in::add_arg(word, ks, in::ArgType::kInt64, static_cast<uint64_t>(v), {});
      return true;
    }
    // Too big for int64: fall through to its decimal string.
  } else if (PyFloat_Check(value)) {
    double d = PyFloat_AS_DOUBLE(value);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    in::add_arg(word, ks, in::ArgType::kDouble, bits, {});
    return true;
  } else if (PyUnicode_Check(value)) {
    Py_ssize_t n;
    const char* s = PyUnicode_AsUTF8AndSize(value, &n);
    if (s == nullptr) return false;
    in::add_arg(word, ks, in::ArgType::kString, 0, std::string_view(s, static_cast<size_t>(n)));
    return true;
  }
  PyObject* str = PyObject_Str(value);
  if (str == nullptr) return false;
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(str, &n);
  if (s != nullptr) in::add_arg(word, ks, in::ArgType::kString, 0, std::string_view(s, static_cast<size_t>(n)));
  Py_DECREF(str);
  return s != nullptr;
}

// Begins the event of `self` if a session records it. Keyword arguments come
// either as vectorcall (kwnames + values) or as a dict.
bool Begin(AnnotationObject* self, PyObject* name, bool step, PyObject* const* kwvalues, PyObject* kwnames,
           PyObject* kwdict) {
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "%s() name must be a str, not %.100s",
                 step ? "StepTraceAnnotation" : "TraceAnnotation", Py_TYPE(name)->tp_name);
    return false;
  }
  if (SPYGLASS_LIKELY(!Recording())) return true;
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(name, &n);
  if (s == nullptr) return false;
  uint64_t word = in::begin_copied(std::string_view(s, static_cast<size_t>(n)), kLevel);
  if (word == 0) return true;  // dropped (buffers full) or the session just ended
  self->word = word;
  self->tb = in::t_slot.buffer;
  if (SPYGLASS_UNLIKELY(g_tracer_follows_annotations)) PythonTracerFollowAnnotation(reinterpret_cast<PyObject*>(self), name);
  if (step) {
    in::add_arg(word, "_r", in::ArgType::kInt64, 1, {});
    if (SPYGLASS_UNLIKELY(in::g_state.slow_step_ticks.load(std::memory_order_relaxed) != 0))
      self->step_begin = in::now_ticks();
  }
  if (kwnames != nullptr) {
    Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; ++i)
      if (!RecordArg(word, PyTuple_GET_ITEM(kwnames, i), kwvalues[i])) return false;
  } else if (kwdict != nullptr) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kwdict, &pos, &k, &v))
      if (!RecordArg(word, k, v)) return false;
  }
  return true;
}

void End(AnnotationObject* self) {
  uint64_t word = self->word;
  if (word == 0) return;
  self->word = 0;
  if (SPYGLASS_UNLIKELY(g_tracer_follows_annotations)) PythonTracerUnfollowAnnotation(reinterpret_cast<PyObject*>(self));
  // Only on the thread that began it (elsewhere it would close another event).
  if (SPYGLASS_LIKELY(in::t_slot.buffer == self->tb)) in::end(word);
  if (SPYGLASS_UNLIKELY(self->step_begin != 0)) {
    uint64_t limit = in::g_state.slow_step_ticks.load(std::memory_order_relaxed);
    if (limit != 0 && in::now_ticks() - self->step_begin > limit) in::step_was_slow();
    self->step_begin = 0;
  }
}

AnnotationObject* Alloc(PyTypeObject* type) {
  AnnotationObject* self;
  if (type == &g_annotation_type && g_free_count > 0) {
    self = g_free_list[--g_free_count];
    PyObject_Init(reinterpret_cast<PyObject*>(self), type);
  } else {
    self = reinterpret_cast<AnnotationObject*>(type->tp_alloc(type, 0));
    if (self == nullptr) return nullptr;
  }
  self->word = 0;
  self->tb = nullptr;
  self->step_begin = 0;
  return self;
}

PyObject* Vectorcall(PyObject* type, PyObject* const* args, size_t nargsf, PyObject* kwnames, bool step) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (SPYGLASS_UNLIKELY(nargs != 1)) {
    PyErr_Format(PyExc_TypeError, "%s() takes one positional argument (the name) and keyword arguments; %zd given",
                 step ? "StepTraceAnnotation" : "TraceAnnotation", nargs);
    return nullptr;
  }
  AnnotationObject* self = Alloc(reinterpret_cast<PyTypeObject*>(type));
  if (self == nullptr) return nullptr;
  if (SPYGLASS_UNLIKELY(!Begin(self, args[0], step, args + 1, kwnames, nullptr))) {
    End(self);
    Py_DECREF(self);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(self);
}

PyObject* AnnotationVectorcall(PyObject* type, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return Vectorcall(type, args, nargsf, kwnames, false);
}
PyObject* StepVectorcall(PyObject* type, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return Vectorcall(type, args, nargsf, kwnames, true);
}

// Subclasses defined in Python are created through tp_new + tp_init, so that
// their own __init__ may compute the name and call super().__init__(name, ...).
PyObject* New(PyTypeObject* type, PyObject*, PyObject*) { return reinterpret_cast<PyObject*>(Alloc(type)); }

int InitImpl(PyObject* self_obj, PyObject* args, PyObject* kwargs, bool step) {
  auto* self = reinterpret_cast<AnnotationObject*>(self_obj);
  if (PyTuple_GET_SIZE(args) != 1) {
    PyErr_Format(PyExc_TypeError, "%s() takes one positional argument (the name) and keyword arguments; %zd given",
                 step ? "StepTraceAnnotation" : "TraceAnnotation", PyTuple_GET_SIZE(args));
    return -1;
  }
  End(self);  // __init__ called again: the previous event ends
  return Begin(self, PyTuple_GET_ITEM(args, 0), step, nullptr, nullptr, kwargs) ? 0 : -1;
}
int Init(PyObject* self, PyObject* args, PyObject* kwargs) { return InitImpl(self, args, kwargs, false); }
int StepInit(PyObject* self, PyObject* args, PyObject* kwargs) { return InitImpl(self, args, kwargs, true); }

void Dealloc(PyObject* obj) {
  // An event never exited stays open: it is closed at stop_trace and marked
  // incomplete (ending it here, at a random point, could close another one).
  if (SPYGLASS_UNLIKELY(g_tracer_follows_annotations) && reinterpret_cast<AnnotationObject*>(obj)->word != 0)
    PythonTracerUnfollowAnnotation(obj);
  PyTypeObject* type = Py_TYPE(obj);
  if (type == &g_annotation_type && g_free_count < kFreeListMax) {
    g_free_list[g_free_count++] = reinterpret_cast<AnnotationObject*>(obj);
    return;
  }
  type->tp_free(obj);
}

PyObject* Enter(PyObject* self, PyObject*) {
  Py_INCREF(self);
  return self;
}

PyObject* Exit(PyObject* self, PyObject* const*, Py_ssize_t) {
  End(reinterpret_cast<AnnotationObject*>(self));
  Py_RETURN_NONE;
}

PyObject* SetMetadata(PyObject* self_obj, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<AnnotationObject*>(self_obj);
  if (PyVectorcall_NARGS(nargsf) != 0) {
    PyErr_SetString(PyExc_TypeError, "set_metadata() takes keyword arguments only");
    return nullptr;
  }
  // Arguments go to the innermost open event of this thread: this one, when
  // it is the innermost.
  if (self->word != 0 && kwnames != nullptr && in::t_slot.buffer == self->tb) {
    Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; ++i)
      if (!RecordArg(self->word, PyTuple_GET_ITEM(kwnames, i), args[i])) return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* IsEnabled(PyObject*, PyObject*) { return PyBool_FromLong(Recording()); }

PyMethodDef g_methods[] = {
    {"__enter__", Enter, METH_NOARGS, "Returns self (the event began at construction)."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Exit)), METH_FASTCALL,
     "Ends the event. Returns None: exceptions propagate."},
    {"set_metadata", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(SetMetadata)),
     METH_FASTCALL | METH_KEYWORDS, "set_metadata(**kwargs): adds arguments to the running event."},
    {"is_enabled", IsEnabled, METH_NOARGS | METH_STATIC,
     "Whether a profiling session is recording annotations now."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void AnnotationPause(PyObject* obj) {
  auto* self = reinterpret_cast<AnnotationObject*>(obj);
  if (self->word != 0 && in::t_slot.buffer == self->tb) in::end(self->word);
  self->word = 0;
}

bool AnnotationResume(PyObject* obj, PyObject* name) {
  auto* self = reinterpret_cast<AnnotationObject*>(obj);
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(name, &n);
  if (s == nullptr) {
    PyErr_Clear();
    return false;
  }
  self->word = in::begin_copied(std::string_view(s, static_cast<size_t>(n)), kLevel);
  self->tb = in::t_slot.buffer;
  return self->word != 0;
}

bool IsAnnotationMethod(const PyMethodDef* ml) {
  return ml >= g_methods && ml < g_methods + sizeof(g_methods) / sizeof(g_methods[0]);
}

bool AddAnnotationTypes(PyObject* module) {
  PyTypeObject& t = g_annotation_type;
  t.tp_name = "spyglass._spyglass.TraceAnnotation";
  t.tp_basicsize = sizeof(AnnotationObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  t.tp_doc =
      "TraceAnnotation(name, **kwargs)\n\nA context manager that records an event named `name` on the calling "
      "thread's timeline while a trace runs.\nKeyword arguments become event arguments (bool -> 1/0, int, float, "
      "str; others str()).";
  t.tp_new = New;
  t.tp_init = Init;
  t.tp_dealloc = Dealloc;
  t.tp_free = PyObject_Free;
  t.tp_methods = g_methods;
  t.tp_vectorcall = AnnotationVectorcall;
  if (PyType_Ready(&t) < 0) return false;

  PyTypeObject& s = g_step_type;
  s.tp_name = "spyglass._spyglass.StepTraceAnnotation";
  s.tp_basicsize = sizeof(AnnotationObject);
  s.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  s.tp_doc =
      "StepTraceAnnotation(name, **kwargs)\n\nA TraceAnnotation that marks one step of a loop (it adds _r=1 "
      "before the keyword arguments);\npass step_num=<int> so that XProf names the step \"<name> <step_num>\".";
  s.tp_base = &g_annotation_type;
  s.tp_new = New;
  s.tp_init = StepInit;
  s.tp_dealloc = Dealloc;
  s.tp_free = PyObject_Free;
  s.tp_vectorcall = StepVectorcall;
  if (PyType_Ready(&s) < 0) return false;

  Py_INCREF(&t);
  if (PyModule_AddObject(module, "TraceAnnotation", reinterpret_cast<PyObject*>(&t)) < 0) return false;
  Py_INCREF(&s);
  if (PyModule_AddObject(module, "StepTraceAnnotation", reinterpret_cast<PyObject*>(&s)) < 0) return false;
  return true;
}

}  // namespace spyglass::python
