// The Python function tracer (python_tracer_level=1).
//
// Hooks, by version:
//   3.12+  sys.monitoring (PEP 669): callbacks get the code object (no frame
//          object is made per call, which the profile hook's emulation on
//          3.12+ does) for PY_START/RESUME/THROW, PY_RETURN/YIELD/UNWIND,
//          CALL + C_RETURN/C_RAISE (C functions), under tool id PROFILER_ID
//          (or another free one). About twice as fast (BENCHMARKS.md); per
//          event what is left above the interpreter's own dispatch is
//          little more than the two clock reads of the begin and the end.
//   else   the C-level profile function (PyEval_SetProfile), installed on
//          every thread at start (the interpreter's thread list) and on
//          threads started later through threading.setprofile.
//   SPYGLASS_PYTHON_TRACER=setprofile forces the profile function on 3.12+
//   (as does a sys.monitoring whose tool ids are all taken).
// On both, threading.setprofile installs a tiny bootstrap that names a new
// thread's timeline after the Python thread (and, for the profile function,
// swaps in the C hook).
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
//
// Annotations left open across a yield: a TraceAnnotation begun inside a
// generator (or coroutine) frame and still open when the frame yields is
// ended there and begun again (same name) when the frame resumes, so that it
// nests inside the frame's events on whatever thread runs it; the first piece
// carries the arguments.
#include "code_extra.h"
#include "python_tracer.h"

#include <Python.h>
#include <frameobject.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

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
uint32_t g_generation = 0;        // bumped at every start and stop: resets thread depths
Py_ssize_t g_code_extra = -1;     // index of our slot in code objects' extra: the name
Py_ssize_t g_untraced_extra = -1;  // and of the one that marks untraced code (see kUntraced)
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
// Marked in a slot of its own, so that the name slot of such code stays
// empty and its calls take the general path (the fast one never sees them).
const char kUntraced[] = "<untraced>";

// Per thread: how many of the events this tracer began are still open, so
// that returns of frames entered before the session (or whose begin was
// dropped) end nothing.
struct CCall;  // sys.monitoring: a C call begun (below)
struct ThreadDepth {
  uint32_t generation = 0;
  uint32_t depth = 0;    // recorded, open
  uint32_t skipped = 0;  // not recorded (untraced, or dropped), on top
  uint32_t open = 0;     // annotations followed in t_open (see below)
  uint32_t c_calls = 0;  // sys.monitoring: C calls begun, in c_call
  // The fast paths' one check of this state (see BeginFast): `generation`
  // when a begin (an end) may take the fast path, else 0 (g_generation is
  // never 0 while hooks are in). Rearm() keeps them.
  uint32_t begin_key = 0;
  uint32_t end_key = 0;
  uint64_t word = 0;
  // The buffer this generation's first recorded begin bound (the recorder's
  // t_slot.buffer then): while t_slot.buffer is still it, the fast path
  // writes there with no session check (see BeginFast).
  in::ThreadBuffer* tb = nullptr;
  CCall* c_call = nullptr;  // sys.monitoring: this thread's t_c_calls (kept across sessions)
};
// initial-exec: one %fs-relative access (the extension is loaded once, early).
thread_local ThreadDepth t_depth __attribute__((tls_model("initial-exec")));

inline ThreadDepth& Depth() {
  ThreadDepth& d = t_depth;
  if (SPYGLASS_UNLIKELY(d.generation != g_generation)) {
    CCall* c_call = d.c_call;
    d = ThreadDepth{};
    d.generation = g_generation;
    d.c_call = c_call;
  }
  return d;
}

// After a change of skipped, open or tb (general paths only).
inline void Rearm(ThreadDepth& d) {
  bool begin = d.skipped == 0 && d.tb != nullptr;
  d.begin_key = begin ? d.generation : 0;
  d.end_key = begin && d.open == 0 ? d.generation : 0;
}

// ---- Annotations open inside a frame ----------------------------------------
// Per thread, the annotations begun while the tracer runs, with the frame
// depth they were begun at (the innermost frame's). When that frame ends with
// one still open, it is ended there; at a yield it is kept in g_suspended and
// begun again when the frame resumes. Bounded: beyond kMaxOpen per thread
// and kMaxSuspended in all, annotations are not followed (they misnest as
// they would without this).
struct OpenAnnotation {
  PyObject* ann;   // borrowed: its `with` holds it
  PyObject* name;  // owned
  uint32_t frame_depth;
};
constexpr uint32_t kMaxOpen = 32;
struct OpenAnnotations {
  uint32_t generation = 0;
  uint32_t n = 0;
  OpenAnnotation a[kMaxOpen];
};
// Kept off the static TLS block (the extension's TLS lives there, and it is
// small): made at a thread's first use.
thread_local std::unique_ptr<OpenAnnotations> t_open;

struct Suspended {
  PyObject* frame;  // owned (kept alive: its address is the key)
  PyObject* ann;    // owned
  PyObject* name;   // owned
};
constexpr size_t kMaxSuspended = 1024;
std::vector<Suspended>* g_suspended = nullptr;

OpenAnnotations& Open() {
  if (SPYGLASS_UNLIKELY(!t_open)) t_open = std::make_unique<OpenAnnotations>();
  OpenAnnotations& o = *t_open;
  if (o.generation != g_generation) {  // left over from an earlier session
    for (uint32_t i = 0; i < o.n; ++i) Py_DECREF(o.a[i].name);
    o.n = 0;
    o.generation = g_generation;
  }
  return o;
}

inline uint32_t FrameDepth(const ThreadDepth& d) { return d.depth + d.skipped; }

void FollowAnnotation(PyObject* ann, PyObject* name) {
  ThreadDepth& d = Depth();
  OpenAnnotations& o = Open();
  if (o.n >= kMaxOpen) return;
  Py_INCREF(name);
  o.a[o.n++] = {ann, name, FrameDepth(d)};
  d.open = o.n;
  Rearm(d);
}

// The frame at the top of this thread ends (yield: `frame` is suspended, or
// nullptr for the current frame): its annotations still open end now.
void CloseAnnotationsOfFrame(bool yield, PyObject* frame) {
  ThreadDepth& d = Depth();
  OpenAnnotations& o = Open();
  uint32_t depth = FrameDepth(d);
  while (o.n > 0 && o.a[o.n - 1].frame_depth >= depth) {
    OpenAnnotation e = o.a[--o.n];
    AnnotationPause(e.ann);
    if (yield && frame == nullptr) frame = reinterpret_cast<PyObject*>(PyEval_GetFrame());
    if (yield && frame != nullptr && g_suspended->size() < kMaxSuspended) {
      Py_INCREF(frame);
      Py_INCREF(e.ann);
      g_suspended->push_back({frame, e.ann, e.name});  // innermost first
    } else {
      Py_DECREF(e.name);
    }
  }
  d.open = o.n;
  Rearm(d);
}

// `frame` resumed (its event just began): its suspended annotations begin again.
void ReopenAnnotations(PyObject* frame) {
  if (frame == nullptr) return;
  std::vector<Suspended>& s = *g_suspended;
  for (size_t i = s.size(); i-- > 0;) {  // outermost first
    if (s[i].frame != frame) continue;
    Suspended e = s[i];
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(i));
    if (AnnotationResume(e.ann, e.name)) FollowAnnotation(e.ann, e.name);
    Py_DECREF(e.name);
    Py_DECREF(e.ann);
    Py_DECREF(e.frame);
  }
}

void ClearSuspended() {
  std::vector<Suspended> s;
  s.swap(*g_suspended);
  for (Suspended& e : s) {
    Py_DECREF(e.name);
    Py_DECREF(e.ann);
    Py_DECREF(e.frame);
  }
}

// ---- Events ------------------------------------------------------------------
// Each begin and end has a fast path, taken on almost every event: the thread
// records (nothing untraced or dropped open, no annotation followed) into the
// buffer it bound in this generation, and the record fits in the current
// chunk. It needs no session check: g_generation changes at every start and
// stop of the hooks, and the host recorder's session runs from before the
// start to after the stop (kRankPython), so a buffer bound in this generation
// records for the running session. Everything else goes through the general
// path (out of line, so that the fast one saves no register).

// A begin with nothing in the way, or false. `name` is not kUntraced (it
// never is in the name caches).
inline bool BeginFast(const char* name) {
  ThreadDepth& d = t_depth;
  // begin_key: this generation, nothing skipped, d.tb set (not null).
  if (SPYGLASS_LIKELY(d.begin_key == g_generation && in::t_slot.buffer == d.tb &&
                      in::try_begin_static(d.tb, name))) {
    ++d.depth;
    return true;
  }
  return false;
}

__attribute__((noinline)) void BeginEventSlow(const char* name) {
  ThreadDepth& d = Depth();
  // Inside a frame not recorded (untraced, or its begin dropped) nothing is
  // recorded: each return then ends what its call began.
  if (d.skipped > 0 || name == kUntraced) {
    ++d.skipped;
  } else if (uint64_t w = in::begin_static(name, kLevel); w != 0) {
    d.word = w;
    // The fast path writes with the recorder's clock read inline only.
    if (in::ticks_inline_usable()) d.tb = in::t_slot.buffer;
    ++d.depth;
  } else {
    ++d.skipped;
  }
  Rearm(d);
}

inline void BeginEvent(const char* name) {
  if (SPYGLASS_UNLIKELY(name == kUntraced || !BeginFast(name))) BeginEventSlow(name);
}

// An end with nothing in the way, or false.
inline bool EndFast() {
  ThreadDepth& d = t_depth;
  // end_key: as begin_key, and no annotation followed.
  if (SPYGLASS_LIKELY(d.end_key == g_generation && d.depth > 0 && in::t_slot.buffer == d.tb &&
                      in::try_end(d.tb))) {
    --d.depth;
    return true;
  }
  return false;
}

// A frame (or C call) ends; `yield`: a generator or coroutine frame suspends
// (`frame`: it, or nullptr for the current one).
__attribute__((noinline)) void EndEventSlow(bool yield, PyObject* frame) {
  ThreadDepth& d = Depth();
  if (SPYGLASS_UNLIKELY(d.open > 0)) CloseAnnotationsOfFrame(yield, frame);
  if (d.skipped > 0) {
    --d.skipped;
    Rearm(d);
  } else if (d.depth > 0) {
    --d.depth;
    in::end(d.word);
  }
}

inline void EndEvent(bool yield = false, PyObject* frame = nullptr) {
  if (SPYGLASS_UNLIKELY(!EndFast())) EndEventSlow(yield, frame);
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

// The layout of a code object's co_extra (CPython's _PyCodeObjectExtra, the
// same from 3.6 to 3.13; its header is internal): read directly on every
// event, as the interpreter's own accessor would (a call into libpython).
struct CodeExtra {
  Py_ssize_t ce_size;
  void* ce_extras[1];
};

const char* CodeNameSlow(PyCodeObject* code);

// The code's name when it has one already, else nullptr.
inline const char* CodeNameCached(PyCodeObject* code) {
  auto* extra = static_cast<CodeExtra*>(code->co_extra);
  if (SPYGLASS_LIKELY(extra != nullptr && g_code_extra < extra->ce_size))
    return static_cast<const char*>(extra->ce_extras[g_code_extra]);
  return nullptr;
}

inline const char* CodeName(PyCodeObject* code) {
  const char* name = CodeNameCached(code);
  return SPYGLASS_LIKELY(name != nullptr) ? name : CodeNameSlow(code);
}

__attribute__((noinline)) const char* CodeNameSlow(PyCodeObject* code) {
  void* extra = nullptr;
  if (SG_GET_EXTRA(reinterpret_cast<PyObject*>(code), g_untraced_extra, &extra) == 0 && extra != nullptr)
    return kUntraced;
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

// "$<module> <method>" of a C method definition `ml`, as XLA names it; the
// key (definition and, for methods, the type of self) names one function.
// In front of the map, a direct-mapped cache: a C call's name is then a few
// loads (the map's hash and probe cost as much as the rest of the event).
struct CNameEntry {
  uint64_t key;
  const char* name;
};
constexpr size_t kCNameCache = 256;
CNameEntry g_cname_cache[kCNameCache];

const char* CMethodNameSlow(uint64_t key, PyMethodDef* ml, PyObject* module, PyObject* self, bool module_named);

struct CNameKey {
  uint64_t key;
  bool module_named;
};
inline CNameKey CMethodKey(PyMethodDef* ml, PyObject* module, PyObject* self) {
  bool module_named = module != nullptr && PyUnicode_Check(module);
  return {reinterpret_cast<uint64_t>(ml) * 31 +
              (module_named || self == nullptr ? 0 : reinterpret_cast<uint64_t>(Py_TYPE(self))),
          module_named};
}
inline CNameEntry& CNameSlot(uint64_t key) { return g_cname_cache[(key ^ (key >> 12)) % kCNameCache]; }

inline const char* CMethodName(PyMethodDef* ml, PyObject* module, PyObject* self) {
  CNameKey k = CMethodKey(ml, module, self);
  CNameEntry& e = CNameSlot(k.key);
  if (SPYGLASS_LIKELY(e.key == k.key && e.name != nullptr)) return e.name;
  e = {k.key, CMethodNameSlow(k.key, ml, module, self, k.module_named)};
  return e.name;
}

__attribute__((noinline)) const char* CMethodNameSlow(uint64_t key, PyMethodDef* ml, PyObject* module,
                                                      PyObject* self, bool module_named) {
  auto it = g_cfunc_names->find(key);
  if (it != g_cfunc_names->end()) return it->second;
  // XLA's Python tracer's names (jax.profiler's traces): the defining module
  // where the function names one (a str m_module), else "<unknown>"; the
  // type of self is not part of the name, so that both traces of a program
  // hold the same names.
  (void)self;
  std::string owner = module_named ? Utf8(module) : "<unknown>";
  const char* name = Intern("$" + owner + " " + (ml->ml_name ? ml->ml_name : "<unknown>"));
  g_cfunc_names->emplace(key, name);
  return name;
}

const char* CFunctionName(PyObject* fn) {
  if (!PyCFunction_Check(fn)) return "$<unknown> <unknown>";
  auto* f = reinterpret_cast<PyCFunctionObject*>(fn);
  return CMethodName(f->m_ml, f->m_module, f->m_self);
}

// TraceAnnotation.__exit__ & co. end events themselves: recording them as C
// calls would interleave their begin/end with the annotation's.
inline bool IsOwnMethod(PyObject* fn) {
  return PyCFunction_Check(fn) && IsAnnotationMethod(reinterpret_cast<PyCFunctionObject*>(fn)->m_ml);
}

inline bool IsGeneratorCode(PyCodeObject* code) {
  return (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) != 0;
}

// ---- The profile function (before 3.12; on 3.12+ when asked or as a fallback)
int ProfileFn(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
  switch (what) {
    case PyTrace_CALL: {  // a call, or a generator resumed
      PyCodeObject* code = PyFrame_GetCode(frame);
      const char* name = CodeName(code);
      Py_DECREF(code);
      BeginEvent(name);
      if (SPYGLASS_UNLIKELY(!g_suspended->empty())) ReopenAnnotations(reinterpret_cast<PyObject*>(frame));
      break;
    }
    case PyTrace_C_CALL:
      if (!IsOwnMethod(arg)) BeginEvent(CFunctionName(arg));
      break;
    case PyTrace_RETURN: {  // a return, or a generator suspended
      bool yield = false;
      if (SPYGLASS_UNLIKELY(t_depth.open > 0)) {
        PyCodeObject* code = PyFrame_GetCode(frame);
        yield = IsGeneratorCode(code);
        Py_DECREF(code);
      }
      EndEvent(yield, reinterpret_cast<PyObject*>(frame));
      break;
    }
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
      if (!IsOwnMethod(arg)) EndEvent();
      break;
    default:
      break;
  }
  return 0;
}

// ---- Another profiler's hook, kept working ------------------------------------
// A thread that another tool profiles (sys.setprofile, cProfile) when the
// session starts, or that the other tool's threading.setprofile hook reaches,
// gets ChainFn: it records as ProfileFn does and calls the other tool's
// function, held in a capsule (the thread's profile object) with its own
// object. At stop the other tool's function and object are put back.
struct ChainedHook {
  Py_tracefunc func;
  PyObject* obj;  // owned
};

void DestroyChain(PyObject* capsule) {
  auto* c = static_cast<ChainedHook*>(PyCapsule_GetPointer(capsule, nullptr));
  if (c == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(c->obj);
  delete c;
}

int ChainFn(PyObject* capsule, PyFrameObject* frame, int what, PyObject* arg) {
  auto* c = static_cast<ChainedHook*>(PyCapsule_GetPointer(capsule, nullptr));
  if (c == nullptr) return -1;
  // Ours inside theirs: our events do not hold the other tool's time.
  bool begins = what == PyTrace_CALL || what == PyTrace_C_CALL;
  if (!begins) ProfileFn(nullptr, frame, what, arg);
  // Kept alive across the call: the other tool may replace this thread's hook.
  Py_INCREF(capsule);
  int r = c->func(c->obj, frame, what, arg);
  Py_DECREF(capsule);
  if (begins) ProfileFn(nullptr, frame, what, arg);
  return r;
}

// The profile hook of `ts` that chains to the one it has (func, obj).
// False (error cleared) when it cannot be made.
bool InstallChain(PyThreadState* ts, Py_tracefunc func, PyObject* obj) {
  auto* c = new ChainedHook{func, obj};
  Py_XINCREF(obj);
  PyObject* capsule = PyCapsule_New(c, nullptr, DestroyChain);
  if (capsule == nullptr) {
    Py_XDECREF(obj);
    delete c;
    PyErr_Clear();
    return false;
  }
  int r = 0;
  if (ts == PyThreadState_Get()) {
    PyEval_SetProfile(ChainFn, capsule);
    r = PyErr_Occurred() ? -1 : 0;
  } else {
#if PY_VERSION_HEX < 0x030C0000
    r = _PyEval_SetProfile(ts, ChainFn, capsule);
#else
    r = -1;  // other threads are chained only before 3.12
#endif
  }
  Py_DECREF(capsule);
  if (r != 0) PyErr_Clear();
  return r == 0;
}

#if PY_VERSION_HEX < 0x030C0000
// Puts back the other tool's hook that ChainFn wraps on `ts`.
void RemoveChain(PyThreadState* ts) {
  PyObject* capsule = ts->c_profileobj;
  auto* c = static_cast<ChainedHook*>(PyCapsule_GetPointer(capsule, nullptr));
  if (c == nullptr) {
    PyErr_Clear();
    _PyEval_SetProfile(ts, nullptr, nullptr);
    return;
  }
  Py_INCREF(capsule);  // c stays valid while the hook is swapped
  _PyEval_SetProfile(ts, c->func, c->obj);
  Py_DECREF(capsule);
  if (PyErr_Occurred()) PyErr_Clear();
}
#endif

// ---- sys.monitoring (3.12+) ---------------------------------------------------
#if PY_VERSION_HEX >= 0x030C0000
#define SG_HAVE_MONITORING 1
int g_tool = -1;  // the tool id we hold, -1: none (the profile function is used)

// The name of a C call's callable, or nullptr when it is not one we record
// (Python functions have their own PY_START; types, other callables: as the
// profile function, not recorded). Method descriptors (`lst.append(x)` calls
// the descriptor with self first) are named as the bound method would be.
inline const char* CCallName(PyObject* callable, PyObject* arg0) {
  if (PyCFunction_Check(callable)) return IsOwnMethod(callable) ? nullptr : CFunctionName(callable);
  if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
    PyMethodDef* ml = reinterpret_cast<PyMethodDescrObject*>(callable)->d_method;
    if (IsAnnotationMethod(ml)) return nullptr;
    PyObject* self = arg0 != nullptr && PyObject_TypeCheck(arg0, PyDescr_TYPE(callable)) ? arg0 : nullptr;
    return CMethodName(ml, nullptr, self != nullptr ? self : reinterpret_cast<PyObject*>(PyDescr_TYPE(callable)));
  }
  return nullptr;
}

// C calls begun, per thread: C_RETURN/C_RAISE end one only when it is the
// innermost event and the same callable (CALL events are switched off where
// a call is not a C function, so a return may come without its begin).
struct CCall {
  PyObject* callable;
  uint32_t frame_depth;
};
constexpr uint32_t kMaxCCalls = 64;
// Off the static TLS block, as t_open; ThreadDepth::c_call points into it
// (an initial-exec access, where this one is a __tls_get_addr call).
thread_local std::unique_ptr<CCall[]> t_c_calls;
PyObject* g_disable = nullptr;  // sys.monitoring.DISABLE

// The callbacks of every event: next to each other (.text.hot), so that the
// interpreter's loop reaches them through fewer code pages.
#define SG_HOT __attribute__((hot))

// Callbacks: (code, offset[, arg[, arg0]]). They return None, or DISABLE for
// a CALL that is not a C function (that place's CALL events stop, until the
// next session's restart_events).
__attribute__((noinline)) PyObject* MonStartSlow(PyCodeObject* code) {
  BeginEventSlow(CodeName(code));
  Py_RETURN_NONE;
}
SG_HOT PyObject* MonStart(PyObject*, PyObject* const* args, size_t, PyObject*) {  // PY_START
  auto* code = reinterpret_cast<PyCodeObject*>(args[0]);
  const char* name = CodeNameCached(code);
  if (SPYGLASS_LIKELY(name != nullptr && BeginFast(name))) Py_RETURN_NONE;
  return MonStartSlow(code);  // a tail call: the fast path has no frame
}
PyObject* MonResume(PyObject*, PyObject* const* args, size_t, PyObject*) {  // PY_RESUME, PY_THROW
  BeginEvent(CodeName(reinterpret_cast<PyCodeObject*>(args[0])));
  if (SPYGLASS_UNLIKELY(!g_suspended->empty())) ReopenAnnotations(reinterpret_cast<PyObject*>(PyEval_GetFrame()));
  Py_RETURN_NONE;
}
__attribute__((noinline)) PyObject* MonReturnSlow() {
  EndEventSlow(false, nullptr);
  Py_RETURN_NONE;
}
SG_HOT PyObject* MonReturn(PyObject*, PyObject* const*, size_t, PyObject*) {  // PY_RETURN, PY_UNWIND
  if (SPYGLASS_LIKELY(EndFast())) Py_RETURN_NONE;
  return MonReturnSlow();
}
PyObject* MonYield(PyObject*, PyObject* const*, size_t, PyObject*) {  // PY_YIELD
  EndEvent(/*yield=*/true);
  Py_RETURN_NONE;
}
__attribute__((noinline)) PyObject* MonCallSlow(PyObject* const* args, size_t nargsf) {
  PyObject* callable = args[2];
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const char* name = CCallName(callable, nargs > 3 ? args[3] : nullptr);
  if (name == nullptr) {
    if (PyCFunction_Check(callable) || Py_IS_TYPE(callable, &PyMethodDescr_Type)) Py_RETURN_NONE;  // ours
    return Py_NewRef(g_disable);
  }
  ThreadDepth& d = Depth();
  if (SPYGLASS_UNLIKELY(d.c_call == nullptr)) {
    if (!t_c_calls) t_c_calls = std::make_unique<CCall[]>(kMaxCCalls);
    d.c_call = t_c_calls.get();
  }
  if (d.c_calls < kMaxCCalls) {
    BeginEvent(name);
    d.c_call[d.c_calls++] = {callable, FrameDepth(d)};
  }
  Py_RETURN_NONE;
}
// The fast path of a C function's call (CALL): a builtin function or method
// descriptor (exact types) whose name is cached (key: CMethodKey; our own
// methods never are), recorded with BeginFast; anything else takes MonCallSlow (which also
// answers DISABLE for callables that are not C functions).
inline PyObject* CCallBegin(PyObject* callable, uint64_t key, PyObject* const* args, size_t nargsf) {
  const CNameEntry& e = CNameSlot(key);
  ThreadDepth& d = t_depth;
  if (SPYGLASS_LIKELY(e.key == key && e.name != nullptr && d.generation == g_generation &&
                      d.c_calls < kMaxCCalls && d.c_call != nullptr && BeginFast(e.name))) {
    d.c_call[d.c_calls++] = {callable, FrameDepth(d)};
    Py_RETURN_NONE;
  }
  return MonCallSlow(args, nargsf);
}

// Method descriptors (`lst.append(x)`), out of MonCall to keep it short.
__attribute__((noinline)) PyObject* MonCallOther(PyObject* const* args, size_t nargsf) {
  PyObject* callable = args[2];
  if (!Py_IS_TYPE(callable, &PyMethodDescr_Type)) return MonCallSlow(args, nargsf);
  // The owner as CCallName names it: self's type when self is an instance, else the descriptor's type.
  PyObject* arg0 = PyVectorcall_NARGS(nargsf) > 3 ? args[3] : nullptr;
  PyObject* self = arg0 != nullptr && PyObject_TypeCheck(arg0, PyDescr_TYPE(callable))
                       ? arg0
                       : reinterpret_cast<PyObject*>(PyDescr_TYPE(callable));
  PyMethodDef* ml = reinterpret_cast<PyMethodDescrObject*>(callable)->d_method;
  return CCallBegin(callable, CMethodKey(ml, nullptr, self).key, args, nargsf);
}

SG_HOT PyObject* MonCall(PyObject*, PyObject* const* args, size_t nargsf, PyObject*) {  // CALL
  PyObject* callable = args[2];
  if (SPYGLASS_LIKELY(Py_IS_TYPE(callable, &PyCFunction_Type))) {
    auto* f = reinterpret_cast<PyCFunctionObject*>(callable);
    return CCallBegin(callable, CMethodKey(f->m_ml, f->m_module, f->m_self).key, args, nargsf);
  }
  return MonCallOther(args, nargsf);
}

SG_HOT PyObject* MonCReturn(PyObject*, PyObject* const* args, size_t, PyObject*) {  // C_RETURN, C_RAISE
  ThreadDepth& d = t_depth;
  // Another generation: no C call of this one is open (Depth() would clear c_calls).
  if (d.generation == g_generation && d.c_calls > 0) {
    const CCall& c = d.c_call[d.c_calls - 1];
    if (c.callable == args[2] && c.frame_depth == FrameDepth(d)) {
      --d.c_calls;
      if (SPYGLASS_LIKELY(EndFast())) Py_RETURN_NONE;
      return MonReturnSlow();
    }
  }
  Py_RETURN_NONE;
}

// The callbacks are objects of a type of our own whose vectorcall is the
// callback itself: the interpreter calls it directly, where a builtin
// function goes through the generic C-function call (thread state, recursion
// check), about a tenth of the interpreter's own cost per event.
struct MonCallback {
  PyObject_HEAD
  vectorcallfunc fn;
};
PyTypeObject g_mon_callback_type = {PyVarObject_HEAD_INIT(nullptr, 0)};
constexpr vectorcallfunc kMonFns[] = {MonStart, MonResume, MonReturn, MonYield, MonCall, MonCReturn};
// sys.monitoring.events names -> callback index in kMonFns.
constexpr std::pair<const char*, int> kMonEvents[] = {
    {"PY_START", 0}, {"PY_RESUME", 1}, {"PY_THROW", 1}, {"PY_RETURN", 2}, {"PY_UNWIND", 2},
    {"PY_YIELD", 3}, {"CALL", 4},      {"C_RETURN", 5}, {"C_RAISE", 5},
};
PyObject* g_mon_callbacks[6] = {};

PyObject* NewMonCallback(int i) {
  if (g_mon_callback_type.tp_flags == 0) {
    PyTypeObject& t = g_mon_callback_type;
    t.tp_name = "spyglass._spyglass._MonitoringCallback";
    t.tp_basicsize = sizeof(MonCallback);
    t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    t.tp_vectorcall_offset = offsetof(MonCallback, fn);
    t.tp_call = PyVectorcall_Call;
    if (PyType_Ready(&t) < 0) {
      t.tp_flags = 0;
      return nullptr;
    }
  }
  MonCallback* cb = PyObject_New(MonCallback, &g_mon_callback_type);
  if (cb != nullptr) cb->fn = kMonFns[i];
  return reinterpret_cast<PyObject*>(cb);
}


// Takes a tool id and installs the callbacks; false (nothing held) when no
// id is free or SPYGLASS_PYTHON_TRACER=setprofile.
bool MonitoringStart() {
  if (const char* e = std::getenv("SPYGLASS_PYTHON_TRACER"); e && std::strcmp(e, "setprofile") == 0) return false;
  PyObject* mon = PySys_GetObject("monitoring");  // borrowed
  if (mon == nullptr) return false;
  int tool = -1;
  for (int id : {2, 3, 4}) {  // PROFILER_ID first, then the ids no one is assigned
    PyObject* r = PyObject_CallMethod(mon, "use_tool_id", "is", id, "spyglass");
    if (r != nullptr) {
      Py_DECREF(r);
      tool = id;
      break;
    }
    PyErr_Clear();
  }
  if (tool < 0) return false;
  if (g_disable == nullptr) g_disable = PyObject_GetAttrString(mon, "DISABLE");
  // Places switched off by an earlier session (DISABLE) record again.
  if (PyObject* r = PyObject_CallMethod(mon, "restart_events", nullptr)) Py_DECREF(r);
  PyErr_Clear();
  PyObject* events = PyObject_GetAttrString(mon, "events");
  long mask = 0;
  bool ok = events != nullptr;
  for (const auto& [name, cb] : kMonEvents) {
    if (!ok) break;
    PyObject* bit = PyObject_GetAttrString(events, name);
    if (bit == nullptr) {
      ok = false;
      break;
    }
    if (g_mon_callbacks[cb] == nullptr) g_mon_callbacks[cb] = NewMonCallback(cb);
    PyObject* r = g_mon_callbacks[cb] ? PyObject_CallMethod(mon, "register_callback", "iOO", tool, bit,
                                                              g_mon_callbacks[cb])
                                      : nullptr;
    mask |= PyLong_AsLong(bit);
    Py_DECREF(bit);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  Py_XDECREF(events);
  ok = ok && g_disable != nullptr;
  PyObject* r = ok ? PyObject_CallMethod(mon, "set_events", "il", tool, mask) : nullptr;
  ok = r != nullptr;
  Py_XDECREF(r);
  if (!ok) {
    PyErr_Clear();
    PyObject* f = PyObject_CallMethod(mon, "free_tool_id", "i", tool);
    Py_XDECREF(f);
    PyErr_Clear();
    return false;
  }
  g_tool = tool;
  return true;
}

void MonitoringStop() {
  if (g_tool < 0) return;
  PyObject* mon = PySys_GetObject("monitoring");
  if (mon != nullptr) {
    PyObject* r = PyObject_CallMethod(mon, "set_events", "ii", g_tool, 0);
    Py_XDECREF(r);
    if (PyObject* events = PyObject_GetAttrString(mon, "events")) {
      for (const auto& [name, cb] : kMonEvents) {
        (void)cb;
        if (PyObject* bit = PyObject_GetAttrString(events, name)) {
          PyObject* u = PyObject_CallMethod(mon, "register_callback", "iOO", g_tool, bit, Py_None);
          Py_XDECREF(u);
          Py_DECREF(bit);
        }
      }
      Py_DECREF(events);
    }
    PyObject* f = PyObject_CallMethod(mon, "free_tool_id", "i", g_tool);
    Py_XDECREF(f);
  }
  PyErr_Clear();
  g_tool = -1;
}
#else
constexpr int g_tool = -1;
bool MonitoringStart() { return false; }
void MonitoringStop() {}
#endif

// threading.setprofile hook: runs on a new thread's first event, names the
// thread's line, and swaps in the C hook (sys.monitoring: removes itself, the
// events already come), or removes itself when the session has ended.
// Another tool's threading.setprofile hook (set before the session) is given
// to the thread too, as threading would have: installed with sys.setprofile
// and called for this first event; the profile function then chains to it.
PyObject* Bootstrap(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* other = g_prev_thread_hook != nullptr && g_prev_thread_hook != Py_None ? g_prev_thread_hook : nullptr;
  if (other != nullptr) {
    Py_INCREF(other);
    PyObject* sys = PyImport_ImportModule("sys");
    PyObject* r = sys != nullptr ? PyObject_CallMethod(sys, "setprofile", "O", other) : nullptr;
    Py_XDECREF(r);
    Py_XDECREF(sys);
    if (r != nullptr && nargs == 3) {  // the event that woke us, for the other tool
      PyObject* seen = PyObject_Vectorcall(other, args, 3, nullptr);
      Py_XDECREF(seen);
    }
    Py_DECREF(other);
    if (PyErr_Occurred()) PyErr_Clear();
  } else if (!g_active || g_tool >= 0) {
    PyEval_SetProfile(nullptr, nullptr);
  }
  if (!g_active) Py_RETURN_NONE;
  if (g_tool < 0) {
    PyThreadState* ts = PyThreadState_Get();
    if (other != nullptr && ts->c_profilefunc != nullptr && ts->c_profilefunc != ProfileFn) {
      if (!InstallChain(ts, ts->c_profilefunc, ts->c_profileobj)) PyEval_SetProfile(ProfileFn, nullptr);
    } else {
      PyEval_SetProfile(ProfileFn, nullptr);
    }
  }
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
  if (g_tool < 0 && nargs >= 2 && PyFrame_Check(args[0]) && PyUnicode_Check(args[1]) &&
      PyUnicode_CompareWithASCIIString(args[1], "call") == 0)
    ProfileFn(nullptr, reinterpret_cast<PyFrameObject*>(args[0]), PyTrace_CALL, nullptr);
  Py_RETURN_NONE;
}

// _untraced(func): marks func's code as Spyglass's own stop path (kUntraced).
PyObject* MarkUntraced(PyObject*, PyObject* func) {
  PyObject* code = PyObject_GetAttrString(func, "__code__");
  if (code == nullptr) return nullptr;
  // The name slot emptied too: a name cached before would take the fast path.
  int r = PyCode_Check(code) ? SG_SET_EXTRA(code, g_untraced_extra, const_cast<char*>(kUntraced)) |
                                   SG_SET_EXTRA(code, g_code_extra, nullptr)
                             : -1;
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

// Sets or clears the profile function on every thread of this interpreter.
// Before 3.12, a thread that another tool profiles (sys.setprofile,
// cProfile) gets ChainFn, which calls that tool's function too; at stop its
// function is put back. (A new thread's bootstrap hook, not yet run, is left.)
void SetHookAllThreads(bool on) {
#if PY_VERSION_HEX >= 0x030C0000
  PyEval_SetProfileAllThreads(on ? ProfileFn : nullptr, nullptr);
  if (PyErr_Occurred()) PyErr_Clear();
#else
  PyThreadState* me = PyThreadState_Get();
  PyInterpreterState* interp = PyThreadState_GetInterpreter(me);
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(interp); ts != nullptr; ts = PyThreadState_Next(ts)) {
    if (on) {
      if (ts->c_profilefunc == nullptr) {
        _PyEval_SetProfile(ts, ProfileFn, nullptr);
      } else if (ts->c_profilefunc != ProfileFn && ts->c_profilefunc != ChainFn &&
                 ts->c_profileobj != g_bootstrap) {
        InstallChain(ts, ts->c_profilefunc, ts->c_profileobj);
      }
    } else if (ts->c_profilefunc == ProfileFn) {
      _PyEval_SetProfile(ts, nullptr, nullptr);
    } else if (ts->c_profilefunc == ChainFn) {
      RemoveChain(ts);
    }
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

void InstallHooks() {
  if (++g_generation == 0) ++g_generation;  // 0: the fast paths' "off" key
  g_active = true;
  g_tracer_follows_annotations = true;
  SetThreadingHook(true);  // first: its own calls are not recorded
  if (!MonitoringStart()) SetHookAllThreads(true);
}

void RemoveHooks() {
  ++g_generation;  // the fast paths stop writing (see BeginFast)
  g_active = false;
  g_tracer_follows_annotations = false;
  if (g_tool >= 0)
    MonitoringStop();
  else
    SetHookAllThreads(false);
  SetThreadingHook(false);
  ClearSuspended();
}

class PythonTracer : public session::Tracer {
 public:
  Status Start() override {
    if (!Py_IsInitialized()) return Status::Ok();
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!SG_IS_FINALIZING() && !g_active) {
      started_ = true;
      InstallHooks();
    }
    PyGILState_Release(gil);
    return Status::Ok();
  }
  Status Stop() override {
    if (!started_ || !Py_IsInitialized()) return Status::Ok();
    started_ = false;
    PyGILState_STATE gil = PyGILState_Ensure();
    ++g_generation;  // also when the hooks stay (finalizing): the session ends
    if (!SG_IS_FINALIZING() && g_active) RemoveHooks();
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

bool g_tracer_follows_annotations = false;

void PythonTracerFollowAnnotation(PyObject* annotation, PyObject* name) {
  if (g_active) FollowAnnotation(annotation, name);
}

void PythonTracerUnfollowAnnotation(PyObject* annotation) {
  ThreadDepth& d = Depth();
  if (d.open == 0) return;
  OpenAnnotations& o = Open();
  for (uint32_t i = o.n; i-- > 0;) {
    if (o.a[i].ann != annotation) continue;
    Py_DECREF(o.a[i].name);
    for (uint32_t j = i; j + 1 < o.n; ++j) o.a[j] = o.a[j + 1];
    --o.n;
    break;
  }
  d.open = o.n;
  Rearm(d);
}

const char* PythonTracerHook() { return !g_active ? "off" : g_tool >= 0 ? "sys.monitoring" : "setprofile"; }

bool RegisterPythonTracer(PyObject* module) {
  g_names = new std::unordered_set<std::string>;
  g_cfunc_names = new std::unordered_map<uint64_t, const char*>;
  g_suspended = new std::vector<Suspended>;
  g_code_extra = SG_REQUEST_EXTRA(NoFree);
  g_untraced_extra = SG_REQUEST_EXTRA(NoFree);
  if (g_code_extra < 0 || g_untraced_extra < 0) {
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
  RemoveHooks();
}

}  // namespace spyglass::python
