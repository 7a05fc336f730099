// The Python function tracer (python_tracer_level=1).
//
// Hook: the C-level profile function (PyEval_SetProfile), installed on every
// thread at start (PyEval_SetProfileAllThreads on 3.12+, the interpreter's
// thread list before) and on threads started later through
// threading.setprofile (a tiny bootstrap that swaps in the C hook on the
// thread's first event). sys.monitoring (3.12+) would need a Python-callable
// per event; the profile function is a plain C call and records no more than
// we need (calls and returns), so it is the hook used on every version.
//
// Events go straight into the annotation recorder (begin_static/end, level 1),
// so Python calls and C++ annotations share one timeline per thread. Names are
// those JAX's python tracer gives:
//   "$<file basename>:<co_firstlineno> <co_name>"   Python functions
//   "$<module> <name>"                              C functions (for methods of
//                                                   a C type: its type name)
// A name is built once per code object (cached in the code object's extra
// slot) or per C method definition, and interned for the life of the process:
// the recorder keeps a pointer to it until the trace is exported.
#include "code_extra.h"
#include "python_tracer.h"

#include <Python.h>
#include <frameobject.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "annotation_type.h"
#include "session/tracer.h"
#include "spyglass/internal/recorder.h"
#include "spyglass/profiler.h"

namespace spyglass::python {
namespace {

namespace in = ::spyglass::internal;

constexpr int kLevel = 1;


#if PY_VERSION_HEX >= 0x030D0000
#define SG_IS_FINALIZING() Py_IsFinalizing()
#else
#define SG_IS_FINALIZING() _Py_IsFinalizing()
#endif

// All of the state below is read and written with the GIL held.
bool g_active = false;            // hooks installed for the running session
uint32_t g_generation = 0;        // bumped at every start: resets thread depths
Py_ssize_t g_code_extra = -1;     // index of our slot in code objects' extra
PyObject* g_bootstrap = nullptr;  // callable handed to threading.setprofile
PyObject* g_prev_thread_hook = nullptr;

// Interned names: never freed (recorded events point into them).
std::unordered_set<std::string>* g_names = nullptr;
std::unordered_map<uint64_t, const char*>* g_cfunc_names = nullptr;

const char* Intern(std::string s) { return g_names->insert(std::move(s)).first->c_str(); }

// The code extra of Spyglass's own stop path (profiler.stop_trace, trace's
// __exit__, the exit hook of a trace started from outside; see _untraced):
// not recorded, and neither is what it calls. Their frames are open when the
// session stops: recorded, they would end it as "incomplete", as the start's
// frames are not recorded either (the hooks go in during the start).
const char kUntraced[] = "<untraced>";

// Per thread: how many of the events this tracer began are still open, so
// that returns of frames entered before the session (or whose begin was
// dropped) end nothing.
struct ThreadDepth {
  uint32_t generation = 0;
  uint32_t depth = 0;    // recorded, open
  uint32_t skipped = 0;  // entered while the recorder dropped, on top
  uint64_t word = 0;
};
// initial-exec: one %fs-relative access (the extension is loaded once, early).
thread_local ThreadDepth t_depth __attribute__((tls_model("initial-exec")));

inline ThreadDepth& Depth() {
  ThreadDepth& d = t_depth;
  if (SPYGLASS_UNLIKELY(d.generation != g_generation)) d = ThreadDepth{g_generation, 0, 0, 0};
  return d;
}

inline void BeginEvent(const char* name) {
  ThreadDepth& d = Depth();
  // Inside a frame not recorded (untraced, or its begin dropped) nothing is
  // recorded: each return then ends what its call began.
  if (SPYGLASS_UNLIKELY(d.skipped > 0 || name == kUntraced)) {
    ++d.skipped;
    return;
  }
  uint64_t w = in::begin_static(name, kLevel);
  if (SPYGLASS_LIKELY(w != 0)) {
    d.word = w;
    ++d.depth;
  } else {
    ++d.skipped;
  }
}

inline void EndEvent() {
  ThreadDepth& d = Depth();
  if (d.skipped > 0) {
    --d.skipped;
  } else if (d.depth > 0) {
    --d.depth;
    in::end(d.word);
  }
}

std::string Utf8(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return "<unknown>";
  Py_ssize_t n;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) {
    PyErr_Clear();
    return "<unknown>";
  }
  return std::string(p, static_cast<size_t>(n));
}

void NoFree(void*) {}

const char* CodeName(PyCodeObject* code) {
  void* extra = nullptr;
  if (SG_GET_EXTRA(reinterpret_cast<PyObject*>(code), g_code_extra, &extra) == 0 && extra != nullptr)
    return static_cast<const char*>(extra);
  PyErr_Clear();
  std::string file = Utf8(code->co_filename);
  size_t slash = file.rfind('/');
  if (slash != std::string::npos) file.erase(0, slash + 1);
  const char* name =
      Intern("$" + file + ":" + std::to_string(code->co_firstlineno) + " " + Utf8(code->co_name));
  if (SG_SET_EXTRA(reinterpret_cast<PyObject*>(code), g_code_extra, const_cast<char*>(name)) != 0) PyErr_Clear();
  return name;
}

const char* CFunctionName(PyObject* fn) {
  if (!PyCFunction_Check(fn)) return "$<unknown> <unknown>";
  auto* f = reinterpret_cast<PyCFunctionObject*>(fn);
  PyObject* self = f->m_self;
  PyObject* module = f->m_module;
  bool module_named = module != nullptr && PyUnicode_Check(module);
  // A method definition belongs to one module or type: with the type of
  // `self` for methods it names one function.
  uint64_t key = reinterpret_cast<uint64_t>(f->m_ml) * 31 +
                 (module_named || self == nullptr ? 0 : reinterpret_cast<uint64_t>(Py_TYPE(self)));
  auto it = g_cfunc_names->find(key);
  if (it != g_cfunc_names->end()) return it->second;
  std::string owner;
  if (module_named) {
    owner = Utf8(module);
  } else if (self != nullptr && PyModule_Check(self)) {
    const char* m = PyModule_GetName(self);
    if (m == nullptr) PyErr_Clear();
    owner = m != nullptr ? m : "<unknown>";
  } else if (self != nullptr && PyType_Check(self)) {
    owner = reinterpret_cast<PyTypeObject*>(self)->tp_name;
  } else if (self != nullptr) {
    owner = Py_TYPE(self)->tp_name;
  } else {
    owner = "<unknown>";
  }
  const char* name = Intern("$" + owner + " " + (f->m_ml->ml_name ? f->m_ml->ml_name : "<unknown>"));
  g_cfunc_names->emplace(key, name);
  return name;
}

// TraceAnnotation.__exit__ & co. end events themselves: recording them as C
// calls would interleave their begin/end with the annotation's.
inline bool IsOwnMethod(PyObject* fn) {
  return PyCFunction_Check(fn) && IsAnnotationMethod(reinterpret_cast<PyCFunctionObject*>(fn)->m_ml);
}

int ProfileFn(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
  switch (what) {
    case PyTrace_CALL: {
      PyCodeObject* code = PyFrame_GetCode(frame);
      const char* name = CodeName(code);
      Py_DECREF(code);
      BeginEvent(name);
      break;
    }
    case PyTrace_C_CALL:
      if (!IsOwnMethod(arg)) BeginEvent(CFunctionName(arg));
      break;
    case PyTrace_RETURN:
      EndEvent();
      break;
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
      if (!IsOwnMethod(arg)) EndEvent();
      break;
    default:
      break;
  }
  return 0;
}

// threading.setprofile hook: runs on a new thread's first event and swaps in
// the C hook (or removes itself when the session has ended).
PyObject* Bootstrap(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!g_active) {
    PyEval_SetProfile(nullptr, nullptr);
    Py_RETURN_NONE;
  }
  PyEval_SetProfile(ProfileFn, nullptr);
  // Name the thread's timeline line after the Python thread.
  if (PyObject* threading = PyImport_ImportModule("threading")) {
    if (PyObject* t = PyObject_CallMethod(threading, "current_thread", nullptr)) {
      if (PyObject* n = PyObject_GetAttrString(t, "name")) {
        profiler::set_thread_name(Utf8(n));
        Py_DECREF(n);
      }
      Py_DECREF(t);
    }
    Py_DECREF(threading);
  }
  PyErr_Clear();
  // The event that woke us (usually the call of Thread.run) is recorded too.
  if (nargs >= 2 && PyFrame_Check(args[0]) && PyUnicode_Check(args[1]) &&
      PyUnicode_CompareWithASCIIString(args[1], "call") == 0)
    ProfileFn(nullptr, reinterpret_cast<PyFrameObject*>(args[0]), PyTrace_CALL, nullptr);
  Py_RETURN_NONE;
}

// _untraced(func): marks func's code as Spyglass's own stop path (kUntraced).
PyObject* MarkUntraced(PyObject*, PyObject* func) {
  PyObject* code = PyObject_GetAttrString(func, "__code__");
  if (code == nullptr) return nullptr;
  int r = PyCode_Check(code) ? SG_SET_EXTRA(code, g_code_extra, const_cast<char*>(kUntraced)) : -1;
  Py_DECREF(code);
  if (r != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_untraced() takes a Python function");
    return nullptr;
  }
  Py_INCREF(func);
  return func;
}

PyMethodDef g_untraced_def = {"_untraced", MarkUntraced, METH_O,
                              "Decorator: the Python tracer records neither this function nor what it calls."};

PyMethodDef g_bootstrap_def = {"_thread_profile_bootstrap",
                               reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Bootstrap)),
                               METH_FASTCALL, "Installs Spyglass's Python tracer on a new thread."};

// Sets or clears our hook on every thread of this interpreter. Before 3.12,
// threads profiled by someone else (cProfile...) are left alone.
void SetHookAllThreads(bool on) {
#if PY_VERSION_HEX >= 0x030C0000
  PyEval_SetProfileAllThreads(on ? ProfileFn : nullptr, nullptr);
  if (PyErr_Occurred()) PyErr_Clear();
#else
  PyThreadState* me = PyThreadState_Get();
  PyInterpreterState* interp = PyThreadState_GetInterpreter(me);
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(interp); ts != nullptr; ts = PyThreadState_Next(ts)) {
    if (on && ts->c_profilefunc == nullptr) _PyEval_SetProfile(ts, ProfileFn, nullptr);
    if (!on && ts->c_profilefunc == ProfileFn) _PyEval_SetProfile(ts, nullptr, nullptr);
    if (PyErr_Occurred()) PyErr_Clear();
  }
#endif
}

void SetThreadingHook(bool on) {
  PyObject* threading = PyImport_ImportModule("threading");
  if (threading == nullptr) {
    PyErr_Clear();
    return;
  }
  if (on) {
    Py_XDECREF(g_prev_thread_hook);
    g_prev_thread_hook = PyObject_GetAttrString(threading, "_profile_hook");
    if (g_prev_thread_hook == nullptr) PyErr_Clear();
    PyObject* r = PyObject_CallMethod(threading, "setprofile", "O", g_bootstrap);
    Py_XDECREF(r);
  } else {
    PyObject* current = PyObject_GetAttrString(threading, "_profile_hook");
    if (current == nullptr) PyErr_Clear();
    if (current == g_bootstrap) {  // leave another tool's hook in place
      PyObject* prev = g_prev_thread_hook != nullptr ? g_prev_thread_hook : Py_None;
      PyObject* r = PyObject_CallMethod(threading, "setprofile", "O", prev);
      Py_XDECREF(r);
    }
    Py_XDECREF(current);
    Py_CLEAR(g_prev_thread_hook);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  Py_DECREF(threading);
}

class PythonTracer : public session::Tracer {
 public:
  Status Start() override {
    if (!Py_IsInitialized()) return Status::Ok();
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!SG_IS_FINALIZING() && !g_active) {
      ++g_generation;
      g_active = true;
      started_ = true;
      SetThreadingHook(true);  // first: its own calls are not recorded
      SetHookAllThreads(true);
    }
    PyGILState_Release(gil);
    return Status::Ok();
  }
  Status Stop() override {
    if (!started_ || !Py_IsInitialized()) return Status::Ok();
    started_ = false;
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!SG_IS_FINALIZING() && g_active) {
      g_active = false;
      SetHookAllThreads(false);
      SetThreadingHook(false);
    }
    PyGILState_Release(gil);
    return Status::Ok();
  }
  // The events are in the recorder; the host tracer collects them.
  Status CollectData(model::Space*) override { return Status::Ok(); }

 private:
  bool started_ = false;
};

// Python events go into the host recorder (TraceMe level 1): its rank starts
// it after the host tracer and stops it before; with the host tracer off
// there is no recorder to write into.
std::unique_ptr<session::Tracer> MakePythonTracer(const profiler::ProfileOptions& o) {
  if (o.python_tracer_level < 1 || o.host_tracer_level < 1) return nullptr;
  return std::make_unique<PythonTracer>();
}

}  // namespace

bool RegisterPythonTracer(PyObject* module) {
  g_names = new std::unordered_set<std::string>;
  g_cfunc_names = new std::unordered_map<uint64_t, const char*>;
  g_code_extra = SG_REQUEST_EXTRA(NoFree);
  if (g_code_extra < 0) {
    PyErr_SetString(PyExc_RuntimeError, "spyglass: no free code-object extra slot for the Python tracer");
    return false;
  }
  g_bootstrap = PyCFunction_NewEx(&g_bootstrap_def, nullptr, nullptr);
  if (g_bootstrap == nullptr) return false;
  Py_INCREF(g_bootstrap);
  if (PyModule_AddObject(module, "_thread_profile_bootstrap", g_bootstrap) < 0) return false;
  PyObject* untraced = PyCFunction_NewEx(&g_untraced_def, nullptr, nullptr);
  if (untraced == nullptr || PyModule_AddObject(module, "_untraced", untraced) < 0) return false;
  // Registered here rather than at load: the tracer needs the state above.
  session::RegisterTracer("python", session::kRankPython, MakePythonTracer);
  return true;
}

void PythonTracerAfterForkChild() {
  // The parent's session does not run here (the core resets it in the child).
  if (!g_active) return;
  g_active = false;
  SetHookAllThreads(false);
  SetThreadingHook(false);
}

}  // namespace spyglass::python
