// TraceAnnotation / StepTraceAnnotation as plain CPython types: the `with`
// hot path is a vectorcall constructor and two C methods, with no Python
// frame and no argument-parsing layer in between.
//
//   TraceAnnotation(name, **kwargs)      begins the event at construction when a
//                                        session records level 1, as JAX does
//   __enter__() -> self, __exit__(...)   ends it (returns None: exceptions pass);
//                                        descriptors of their own, bound without a GC object
//   set_metadata(**kwargs)               adds arguments to the running event
//   TraceAnnotation.is_enabled()         whether a session records annotations
//
// Keyword values become typed event arguments: bool -> 1/0 (int64), int ->
// int64 (beyond int64: its decimal string), float -> double, str -> string,
// anything else -> str(value).
#include "annotation_type.h"

#include <Python.h>

#include "python_tracer.h"

#include <cstddef>
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

// The UTF-8 bytes of a str: an ASCII name (the usual case) is read in place,
// without the call into the interpreter.
inline bool NameUtf8(PyObject* name, std::string_view* out) {
  if (SPYGLASS_LIKELY(PyUnicode_IS_COMPACT_ASCII(name))) {
    *out = std::string_view(reinterpret_cast<const char*>(reinterpret_cast<PyASCIIObject*>(name) + 1),
                            static_cast<size_t>(PyUnicode_GET_LENGTH(name)));
    return true;
  }
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(name, &n);
  if (s == nullptr) return false;
  *out = std::string_view(s, static_cast<size_t>(n));
  return true;
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
  std::string_view utf8;
  if (!NameUtf8(name, &utf8)) return false;
  uint64_t word = in::begin_copied(utf8, kLevel);
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

// ---- __enter__ / __exit__
//
// `with` looks both up on the type and binds them to the instance. A method
// of tp_methods would be bound into a new builtin method object each time (a
// GC allocation, tracked and untracked, twice per `with`). These are
// descriptors of their own whose binding comes from a small free list and is
// called through vectorcall: same behaviour (a bound callable with __self__
// and __name__; the unbound one takes the instance first), none of that cost.
// Bound methods are not GC-tracked: a cycle through one (an instance that
// stores its own bound __exit__) is not collected.

enum Which : int { kEnter = 0, kExit = 1 };
constexpr const char* kMethodNames[] = {"__enter__", "__exit__"};
constexpr const char* kMethodDocs[] = {"Returns self (the event began at construction).",
                                       "Ends the event. Returns None: exceptions propagate."};

// The call itself, `self` checked by the caller.
inline PyObject* CallMethod(Which which, PyObject* self, Py_ssize_t nargs, PyObject* kwnames) {
  if (SPYGLASS_UNLIKELY(kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_Format(PyExc_TypeError, "%s() takes no keyword arguments", kMethodNames[which]);
    return nullptr;
  }
  if (which == kEnter) {
    if (SPYGLASS_UNLIKELY(nargs != 0)) {
      PyErr_Format(PyExc_TypeError, "__enter__() takes no arguments (%zd given)", nargs);
      return nullptr;
    }
    Py_INCREF(self);
    return self;
  }
  End(reinterpret_cast<AnnotationObject*>(self));
  Py_RETURN_NONE;
}

struct BoundMethodObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* self;  // strong
  Which which;
};

struct MethodDescrObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Which which;
};

PyTypeObject g_bound_type = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject g_descr_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

// `with` holds two at once (the bound __exit__ during the body); nesting more.
constexpr int kBoundFreeListMax = 16;
BoundMethodObject* g_bound_free_list[kBoundFreeListMax];
int g_bound_free_count = 0;

PyObject* BoundVectorcall(PyObject* obj, PyObject* const*, size_t nargsf, PyObject* kwnames) {
  auto* m = reinterpret_cast<BoundMethodObject*>(obj);
  return CallMethod(m->which, m->self, PyVectorcall_NARGS(nargsf), kwnames);
}

void BoundDealloc(PyObject* obj) {
  auto* m = reinterpret_cast<BoundMethodObject*>(obj);
  PyObject* self = m->self;
  if (g_bound_free_count < kBoundFreeListMax) {
    g_bound_free_list[g_bound_free_count++] = m;
  } else {
    PyObject_Free(obj);
  }
  Py_DECREF(self);  // last: it may run the instance's own dealloc
}

PyObject* BoundRepr(PyObject* obj) {
  auto* m = reinterpret_cast<BoundMethodObject*>(obj);
  return PyUnicode_FromFormat("<built-in method %s of %s object at %p>", kMethodNames[m->which],
                              Py_TYPE(m->self)->tp_name, m->self);
}

PyObject* BoundGetSelf(PyObject* obj, void*) {
  PyObject* self = reinterpret_cast<BoundMethodObject*>(obj)->self;
  Py_INCREF(self);
  return self;
}
// __name__ and __doc__ of a bound method or of a descriptor (T): its method's.
template <class T>
PyObject* GetName(PyObject* obj, void*) {
  return PyUnicode_FromString(kMethodNames[reinterpret_cast<T*>(obj)->which]);
}
template <class T>
PyObject* GetDoc(PyObject* obj, void*) {
  return PyUnicode_FromString(kMethodDocs[reinterpret_cast<T*>(obj)->which]);
}

PyGetSetDef g_bound_getset[] = {{"__self__", BoundGetSelf, nullptr, nullptr, nullptr},
                                {"__name__", GetName<BoundMethodObject>, nullptr, nullptr, nullptr},
                                {"__doc__", GetDoc<BoundMethodObject>, nullptr, nullptr, nullptr},
                                {nullptr, nullptr, nullptr, nullptr, nullptr}};

// Whether `instance` is one that method `which` applies to (TypeError if not).
inline bool AppliesTo(Which which, PyObject* instance) {
  if (SPYGLASS_LIKELY(PyObject_TypeCheck(instance, &g_annotation_type))) return true;
  PyErr_Format(PyExc_TypeError, "descriptor '%s' for 'TraceAnnotation' objects doesn't apply to a '%.100s' object",
               kMethodNames[which], Py_TYPE(instance)->tp_name);
  return false;
}

PyObject* DescrGet(PyObject* obj, PyObject* instance, PyObject*) {
  auto* d = reinterpret_cast<MethodDescrObject*>(obj);
  if (instance == nullptr) {  // looked up on the class
    Py_INCREF(obj);
    return obj;
  }
  if (!AppliesTo(d->which, instance)) return nullptr;
  BoundMethodObject* m;
  if (SPYGLASS_LIKELY(g_bound_free_count > 0)) {
    m = g_bound_free_list[--g_bound_free_count];
  } else {
    m = static_cast<BoundMethodObject*>(PyObject_Malloc(sizeof(BoundMethodObject)));
    if (m == nullptr) return PyErr_NoMemory();
  }
  PyObject_Init(reinterpret_cast<PyObject*>(m), &g_bound_type);
  m->vectorcall = BoundVectorcall;
  Py_INCREF(instance);
  m->self = instance;
  m->which = d->which;
  return reinterpret_cast<PyObject*>(m);
}

// TraceAnnotation.__exit__(a, ...): the instance first.
PyObject* DescrVectorcall(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* d = reinterpret_cast<MethodDescrObject*>(obj);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 1) {
    PyErr_Format(PyExc_TypeError, "unbound method %s() needs an argument", kMethodNames[d->which]);
    return nullptr;
  }
  if (!AppliesTo(d->which, args[0])) return nullptr;
  return CallMethod(d->which, args[0], nargs - 1, kwnames);
}

PyObject* DescrRepr(PyObject* obj) {
  return PyUnicode_FromFormat("<method '%s' of 'TraceAnnotation' objects>",
                              kMethodNames[reinterpret_cast<MethodDescrObject*>(obj)->which]);
}
PyObject* DescrGetObjclass(PyObject*, void*) {
  Py_INCREF(&g_annotation_type);
  return reinterpret_cast<PyObject*>(&g_annotation_type);
}

PyGetSetDef g_descr_getset[] = {{"__name__", GetName<MethodDescrObject>, nullptr, nullptr, nullptr},
                                {"__doc__", GetDoc<MethodDescrObject>, nullptr, nullptr, nullptr},
                                {"__objclass__", DescrGetObjclass, nullptr, nullptr, nullptr},
                                {nullptr, nullptr, nullptr, nullptr, nullptr}};

// __enter__ and __exit__, by Which.
MethodDescrObject g_descrs[] = {{PyObject_HEAD_INIT(nullptr) DescrVectorcall, kEnter},
                                {PyObject_HEAD_INIT(nullptr) DescrVectorcall, kExit}};

// Readies a method type (T: BoundMethodObject or MethodDescrObject), called
// through the vectorcall pointer it holds; its other slots are set.
template <class T>
bool ReadyMethodType(PyTypeObject& t, const char* name, unsigned long more_flags) {
  t.tp_name = name;
  t.tp_basicsize = sizeof(T);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | more_flags;
  t.tp_vectorcall_offset = offsetof(T, vectorcall);
  t.tp_call = PyVectorcall_Call;
  return PyType_Ready(&t) >= 0;
}

bool ReadyMethodTypes() {
  g_bound_type.tp_dealloc = BoundDealloc;
  g_bound_type.tp_repr = BoundRepr;
  g_bound_type.tp_getset = g_bound_getset;
  if (!ReadyMethodType<BoundMethodObject>(g_bound_type, "spyglass._spyglass._AnnotationBoundMethod", 0)) return false;
  g_descr_type.tp_descr_get = DescrGet;
  g_descr_type.tp_repr = DescrRepr;
  g_descr_type.tp_getset = g_descr_getset;
  if (!ReadyMethodType<MethodDescrObject>(g_descr_type, "spyglass._spyglass._AnnotationMethod",
                                          Py_TPFLAGS_METHOD_DESCRIPTOR))
    return false;
  // Statically allocated, never freed.
  for (MethodDescrObject& d : g_descrs) PyObject_Init(reinterpret_cast<PyObject*>(&d), &g_descr_type);
  return true;
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
  std::string_view utf8;
  if (!NameUtf8(name, &utf8)) {
    PyErr_Clear();
    return false;
  }
  self->word = in::begin_copied(utf8, kLevel);
  self->tb = in::t_slot.buffer;
  return self->word != 0;
}

bool IsAnnotationMethod(const PyMethodDef* ml) {
  return ml >= g_methods && ml < g_methods + sizeof(g_methods) / sizeof(g_methods[0]);
}

// The slots TraceAnnotation and StepTraceAnnotation share.
void SetAnnotationSlots(PyTypeObject& t, const char* name, const char* doc, initproc init, vectorcallfunc vectorcall) {
  t.tp_name = name;
  t.tp_basicsize = sizeof(AnnotationObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  t.tp_doc = doc;
  t.tp_new = New;
  t.tp_init = init;
  t.tp_dealloc = Dealloc;
  t.tp_free = PyObject_Free;
  t.tp_vectorcall = vectorcall;
}

bool AddAnnotationTypes(PyObject* module) {
  PyTypeObject& t = g_annotation_type;
  SetAnnotationSlots(
      t, "spyglass._spyglass.TraceAnnotation",
      "TraceAnnotation(name, **kwargs)\n\nA context manager that records an event named `name` on the calling "
      "thread's timeline while a trace runs.\nKeyword arguments become event arguments (bool -> 1/0, int, float, "
      "str; others str()).",
      Init, AnnotationVectorcall);
  t.tp_methods = g_methods;
  if (!ReadyMethodTypes() || PyType_Ready(&t) < 0) return false;
  // __enter__/__exit__ join the type's dict before StepTraceAnnotation
  // inherits from it (PyType_Modified: the type's attribute cache).
  for (MethodDescrObject& d : g_descrs)
    if (PyDict_SetItemString(t.tp_dict, kMethodNames[d.which], reinterpret_cast<PyObject*>(&d)) < 0) return false;
  PyType_Modified(&t);

  PyTypeObject& s = g_step_type;
  SetAnnotationSlots(
      s, "spyglass._spyglass.StepTraceAnnotation",
      "StepTraceAnnotation(name, **kwargs)\n\nA TraceAnnotation that marks one step of a loop (it adds _r=1 "
      "before the keyword arguments);\npass step_num=<int> so that XProf names the step \"<name> <step_num>\".",
      StepInit, StepVectorcall);
  s.tp_base = &g_annotation_type;
  if (PyType_Ready(&s) < 0) return false;

  Py_INCREF(&t);
  if (PyModule_AddObject(module, "TraceAnnotation", reinterpret_cast<PyObject*>(&t)) < 0) return false;
  Py_INCREF(&s);
  if (PyModule_AddObject(module, "StepTraceAnnotation", reinterpret_cast<PyObject*>(&s)) < 0) return false;
  return true;
}

}  // namespace spyglass::python
