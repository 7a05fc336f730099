// Memory tracking with Python stacks (python_memory.h).
//
// Stacks: the allocating thread's Python frames, innermost first, at most 64,
// each a symbolic frame (function = co_name as in JAX's heap profiles, file =
// co_filename, line = the frame's current line). A code object's interned
// function id is cached in its extra slot, so a walk costs a frame step and a
// line lookup per frame. Without the GIL (PyGILState_Check() false) the stack
// is empty: Python frames can only be read with it.
//
// numpy: NumPy >= 1.22 allocates array data through a PyDataMem_Handler (a
// capsule named "mem_handler"). The documented way to change it,
// PyDataMem_SetHandler, sets a ContextVar: it covers the calling thread's
// context only, and every thread started later begins with numpy's default
// handler. To see the arrays of all threads (as jax's device_memory_profile
// sees all live arrays), track_numpy wraps numpy's *default* handler in
// place: its malloc/calloc/realloc/free entries are swapped for ours, which
// call the saved originals and record/remove. No numpy headers are needed:
// the handler layout (version 1) and the C-API slots used (211
// PyArray_GetNDArrayCFeatureVersion, 306 PyDataMem_DefaultHandler) are
// NumPy's documented ABI. Handlers a program sets itself are left alone.
//
// Undo (track_numpy(False)): recording stops at once; numpy's entries are put
// back when no array recorded by us is still alive, else the wrappers stay as
// pass-through (state "draining": frees still remove their records, so the
// profile never keeps a freed array) until a later track_numpy(False) finds
// none left.
#include "code_extra.h"
#include "python_memory.h"

#include <frameobject.h>
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "gpu/gpu_callback.h"
#include "memory/tracker.h"
#include "spyglass/memory.h"

namespace spyglass::python {
namespace {

namespace mi = ::spyglass::memory::internal;


constexpr int kMaxPythonFrames = 64;

Py_ssize_t g_fn_extra = -1;  // code-object extra slot: interned function id
// Set while this thread walks its stack: an allocation made by the walk itself
// (a frame object materialized, a collection it triggers) records no stack.
thread_local bool t_walking __attribute__((tls_model("initial-exec"))) = false;

// ---- Python stacks -----------------------------------------------------------

std::string_view Utf8View(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return "<unknown>";
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) {
    PyErr_Clear();
    return "<unknown>";
  }
  return {p, static_cast<size_t>(n)};
}

uint32_t FunctionIdOf(PyCodeObject* code) {
  void* extra = nullptr;
  if (g_fn_extra >= 0 && SG_GET_EXTRA(reinterpret_cast<PyObject*>(code), g_fn_extra, &extra) == 0 && extra != nullptr)
    return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(extra));
  PyErr_Clear();
  uint32_t id = mi::InternFunction(Utf8View(code->co_name), Utf8View(code->co_filename));
  if (id != 0 && g_fn_extra >= 0 &&
      SG_SET_EXTRA(reinterpret_cast<PyObject*>(code), g_fn_extra, reinterpret_cast<void*>(uintptr_t{id})) != 0)
    PyErr_Clear();
  return id;  // 0 (table full, counted) reads "<unknown>" in the profile
}

// The calling thread's Python stack as symbolic frames; the GIL is held.
int WalkPythonStack(uintptr_t* out, int max) {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return 0;
  // Keep a pending exception of the caller's (our lookups may clear errors).
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* exc = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
#endif
  int n = 0;
  PyFrameObject* f = PyThreadState_GetFrame(ts);  // new reference or NULL
  while (f != nullptr && n < max) {
    PyCodeObject* code = PyFrame_GetCode(f);
    out[n++] = mi::SymbolicFrame(FunctionIdOf(code), PyFrame_GetLineNumber(f));
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyErr_Restore(type, value, tb);
#endif
  return n;
}

// Records [ptr, ptr+bytes) in class `cls` with the current Python stack
// (empty without the GIL). Returns whether it was recorded.
bool RecordWithPythonStack(uintptr_t ptr, uint64_t bytes, uint32_t cls) {
  if (ptr == 0 || !mi::g_api_enabled.load(std::memory_order_relaxed)) return false;
  uintptr_t words[kMaxPythonFrames];
  int n = 0;
  if (!t_walking && PyGILState_Check()) {
    t_walking = true;
    n = WalkPythonStack(words, kMaxPythonFrames);
    t_walking = false;
  }
  if (!mi::Guard::Enter()) {
    if (mi::Guard::InsideTracking()) mi::Count(mi::kReentrant);
    return false;
  }
  mi::Record(ptr, bytes, cls, words, n);
  mi::Guard::Leave();
  return true;
}

// ---- numpy's data-memory handler (NumPy's ABI, version 1) -----------------------

struct NpyAllocator {
  void* ctx;
  void* (*malloc)(void* ctx, size_t size);
  void* (*calloc)(void* ctx, size_t nelem, size_t elsize);
  void* (*realloc)(void* ctx, void* ptr, size_t new_size);
  void (*free)(void* ctx, void* ptr, size_t size);
};
struct NpyHandler {
  char name[127];
  uint8_t version;  // 1
  NpyAllocator allocator;
};
static_assert(offsetof(NpyHandler, allocator) == 128, "PyDataMem_Handler layout");
constexpr int kApiFeatureVersionSlot = 211;  // unsigned int PyArray_GetNDArrayCFeatureVersion(void)
constexpr int kApiDefaultHandlerSlot = 306;  // PyObject* PyDataMem_DefaultHandler
constexpr unsigned kNpy122ApiVersion = 0xf;  // NPY_1_22_API_VERSION: the handler API

NpyHandler* g_np_target = nullptr;  // numpy's default handler, patched while installed
NpyAllocator g_np_orig{};           // its entries before (written before ours are published)
uint32_t g_np_class = 0;            // ("cpu:0", "buffer")
std::atomic<bool> g_np_on{false};   // recording new arrays
std::atomic<int64_t> g_np_live{0};  // our records not yet freed (approximate, >= the truth)
std::atomic<int64_t> g_np_inflight{0};

// Records a new numpy allocation (the check of g_np_on and the record happen
// inside an in-flight window, so that track_numpy(False) can wait them out).
void NpTrack(void* p, size_t bytes) {
  if (p == nullptr) return;
  g_np_inflight.fetch_add(1, std::memory_order_seq_cst);
  if (g_np_on.load(std::memory_order_seq_cst) &&
      RecordWithPythonStack(reinterpret_cast<uintptr_t>(p), bytes, g_np_class))
    g_np_live.fetch_add(1, std::memory_order_relaxed);
  g_np_inflight.fetch_sub(1, std::memory_order_release);
}

// Removes our record of `p`, if any (arrays allocated before tracking are not
// counted as unknown frees).
void NpForget(void* p) {
  if (p == nullptr || !mi::Guard::Enter()) return;
  bool removed = mi::RemoveIfTracked(reinterpret_cast<uintptr_t>(p));
  mi::Guard::Leave();
  if (removed) g_np_live.fetch_sub(1, std::memory_order_relaxed);
}

void* NpMalloc(void*, size_t size) {
  void* p = g_np_orig.malloc(g_np_orig.ctx, size);
  NpTrack(p, size);
  return p;
}
void* NpCalloc(void*, size_t nelem, size_t elsize) {
  void* p = g_np_orig.calloc(g_np_orig.ctx, nelem, elsize);
  size_t bytes;
  if (__builtin_mul_overflow(nelem, elsize, &bytes)) bytes = SIZE_MAX;
  NpTrack(p, bytes);
  return p;
}
void* NpRealloc(void*, void* old, size_t size) {
  // Forget first: once the old block is given back another thread may get
  // (and record) the same address. If realloc fails numpy keeps `old`
  // untracked (its later free is quiet).
  NpForget(old);
  void* p = g_np_orig.realloc(g_np_orig.ctx, old, size);
  NpTrack(p, size);
  return p;
}
void NpFree(void*, void* p, size_t size) {
  NpForget(p);
  g_np_orig.free(g_np_orig.ctx, p, size);
}

template <typename T>
void StoreEntry(T* slot, T value) {
  __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
}

bool Writable(const void* p, size_t n) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  char line[512];
  bool ok = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (a >= lo && a + n <= hi) {
      ok = perms[0] == 'r' && perms[1] == 'w';
      break;
    }
  }
  std::fclose(f);
  return ok;
}

// numpy's default handler, checked; nullptr with a Python error set.
NpyHandler* NumpyDefaultHandler() {
  PyObject* m = PyImport_ImportModule("numpy._core._multiarray_umath");  // NumPy 2
  if (m == nullptr && PyErr_ExceptionMatches(PyExc_ImportError)) {
    PyErr_Clear();
    m = PyImport_ImportModule("numpy.core._multiarray_umath");  // NumPy 1.x
  }
  if (m == nullptr) return nullptr;
  PyObject* cap = PyObject_GetAttrString(m, "_ARRAY_API");
  Py_DECREF(m);
  if (cap == nullptr) return nullptr;
  // The module (imported for the life of the process) owns the table.
  void** api = PyCapsule_CheckExact(cap) ? static_cast<void**>(PyCapsule_GetPointer(cap, nullptr)) : nullptr;
  Py_DECREF(cap);
  if (api == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "spyglass: numpy's _ARRAY_API is not a capsule");
    return nullptr;
  }
  unsigned feature = reinterpret_cast<unsigned (*)()>(api[kApiFeatureVersionSlot])();
  if (feature < kNpy122ApiVersion) {
    PyErr_Format(PyExc_RuntimeError,
                 "spyglass: tracking numpy arrays needs NumPy >= 1.22 (its data-memory handler API); "
                 "this NumPy's C-API feature version is 0x%x",
                 feature);
    return nullptr;
  }
  PyObject* handler = *static_cast<PyObject**>(api[kApiDefaultHandlerSlot]);
  auto* h = handler != nullptr ? static_cast<NpyHandler*>(PyCapsule_GetPointer(handler, "mem_handler")) : nullptr;
  if (h == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "spyglass: numpy has no default mem_handler");
    return nullptr;
  }
  if (h->version != 1) {
    PyErr_Format(PyExc_RuntimeError, "spyglass: numpy's mem_handler has version %d (1 is supported)",
                 static_cast<int>(h->version));
    return nullptr;
  }
  if (!Writable(&h->allocator, sizeof h->allocator)) {
    PyErr_SetString(PyExc_RuntimeError, "spyglass: numpy's default mem_handler is not writable here");
    return nullptr;
  }
  return h;
}

bool Installed() { return g_np_target != nullptr; }

// All of the control below runs with the GIL held.
bool InstallNumpyHook() {
  if (Installed()) return true;
  NpyHandler* h = NumpyDefaultHandler();
  if (h == nullptr) return false;
  if (h->allocator.malloc == NpMalloc) {  // ours already (a second copy of the extension: not supported)
    PyErr_SetString(PyExc_RuntimeError, "spyglass: numpy's handler is already wrapped");
    return false;
  }
  g_np_class = mi::InternClass("cpu:0", "buffer");
  g_np_orig = h->allocator;
  g_np_target = h;
  // Frees and reallocs first: no array we record can reach numpy's own free.
  StoreEntry(&h->allocator.free, &NpFree);
  StoreEntry(&h->allocator.realloc, &NpRealloc);
  StoreEntry(&h->allocator.calloc, &NpCalloc);
  StoreEntry(&h->allocator.malloc, &NpMalloc);
  return true;
}

// Puts numpy's entries back if no array of ours is alive (and nobody wrapped
// ours meanwhile). Recording is off and no record is in flight.
void TryRemoveNumpyHook() {
  NpyHandler* h = g_np_target;
  if (h == nullptr || g_np_live.load(std::memory_order_acquire) > 0) return;
  if (h->allocator.malloc != NpMalloc || h->allocator.calloc != NpCalloc || h->allocator.realloc != NpRealloc ||
      h->allocator.free != NpFree)
    return;
  StoreEntry(&h->allocator.malloc, g_np_orig.malloc);
  StoreEntry(&h->allocator.calloc, g_np_orig.calloc);
  StoreEntry(&h->allocator.realloc, g_np_orig.realloc);
  StoreEntry(&h->allocator.free, g_np_orig.free);
  g_np_target = nullptr;
  g_np_live.store(0, std::memory_order_relaxed);
}

const char* HookState() {
  if (!Installed()) return "removed";
  return g_np_on.load() ? "tracking" : "draining";
}

// ---- module functions ------------------------------------------------------------

// obj_or_ptr -> address (and the buffer's length, -1 for an int).
bool AddressOf(PyObject* obj, const char* fn, uintptr_t* ptr, Py_ssize_t* len) {
  if (PyLong_Check(obj)) {
    void* p = PyLong_AsVoidPtr(obj);
    if (p == nullptr && PyErr_Occurred()) return false;
    *ptr = reinterpret_cast<uintptr_t>(p);
    *len = -1;
  } else if (PyObject_CheckBuffer(obj)) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) < 0) return false;
    *ptr = reinterpret_cast<uintptr_t>(view.buf);
    *len = view.len;
    PyBuffer_Release(&view);
  } else {
    PyErr_Format(PyExc_TypeError, "%s: expected an int address or an object with the buffer protocol, not %.100s",
                 fn, Py_TYPE(obj)->tp_name);
    return false;
  }
  if (*ptr == 0) {
    PyErr_Format(PyExc_ValueError, "%s: the address is 0", fn);
    return false;
  }
  return true;
}

bool Utf8Arg(PyObject* s, const char* fn, const char* what, std::string_view* out) {
  if (!PyUnicode_Check(s)) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be a str, not %.100s", fn, what, Py_TYPE(s)->tp_name);
    return false;
  }
  Py_ssize_t n;
  const char* p = PyUnicode_AsUTF8AndSize(s, &n);
  if (p == nullptr) return false;
  *out = {p, static_cast<size_t>(n)};
  return true;
}

PyObject* RecordAllocation(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"obj_or_ptr", "nbytes", "device", "kind", nullptr};
  PyObject *obj, *nbytes = Py_None, *device = nullptr, *kind = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OUU:record_allocation", const_cast<char**>(kw), &obj, &nbytes,
                                   &device, &kind))
    return nullptr;
  uintptr_t ptr;
  Py_ssize_t len;
  if (!AddressOf(obj, "record_allocation", &ptr, &len)) return nullptr;
  uint64_t bytes;
  if (nbytes == Py_None) {
    if (len < 0) {
      PyErr_SetString(PyExc_TypeError, "record_allocation: nbytes is required with an int address");
      return nullptr;
    }
    bytes = static_cast<uint64_t>(len);
  } else {
    long long n = PyLong_AsLongLong(nbytes);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    if (n < 0) {
      PyErr_SetString(PyExc_ValueError, "record_allocation: nbytes must be >= 0");
      return nullptr;
    }
    bytes = static_cast<uint64_t>(n);
  }
  std::string_view dev = "cpu:0", k = "buffer";
  if (device != nullptr && !Utf8Arg(device, "record_allocation", "device", &dev)) return nullptr;
  if (kind != nullptr && !Utf8Arg(kind, "record_allocation", "kind", &k)) return nullptr;
  RecordWithPythonStack(ptr, bytes, mi::InternClass(dev, k));
  return PyLong_FromVoidPtr(reinterpret_cast<void*>(ptr));
}

PyObject* RecordFree(PyObject*, PyObject* obj) {
  uintptr_t ptr;
  Py_ssize_t len;
  if (!AddressOf(obj, "record_free", &ptr, &len)) return nullptr;
  memory::record_free(reinterpret_cast<const void*>(ptr));
  Py_RETURN_NONE;
}

PyObject* TrackNumpy(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"enable", nullptr};
  int enable = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:track_numpy", const_cast<char**>(kw), &enable)) return nullptr;
  bool was = g_np_on.load();
  if (enable) {
    if (!InstallNumpyHook()) return nullptr;
    g_np_on.store(true, std::memory_order_seq_cst);
  } else {
    g_np_on.store(false, std::memory_order_seq_cst);
    // A record that saw "on" finishes before we look at what is alive. Such
    // a record runs without the GIL (we hold it): it never waits for us.
    while (g_np_inflight.load(std::memory_order_seq_cst) != 0) sched_yield();
    TryRemoveNumpyHook();
  }
  return PyBool_FromLong(was);
}

PyObject* NumpyTracking(PyObject*, PyObject*) { return PyBool_FromLong(g_np_on.load()); }
PyObject* NumpyHookState(PyObject*, PyObject*) { return PyUnicode_FromString(HookState()); }

PyObject* TrackingStats(PyObject*, PyObject*) {
  memory::TrackingStats s;
  Py_BEGIN_ALLOW_THREADS
  s = memory::tracking_stats();
  Py_END_ALLOW_THREADS
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  auto put = [&](const char* k, uint64_t v) {
    PyObject* o = PyLong_FromUnsignedLongLong(v);
    bool ok = o != nullptr && PyDict_SetItemString(d, k, o) == 0;
    Py_XDECREF(o);
    return ok;
  };
  bool ok = put("allocations", s.allocations) && put("frees", s.frees) &&
            put("live_allocations", s.live_allocations) && put("live_bytes", s.live_bytes) &&
            put("unknown_frees", s.unknown_frees) && put("double_frees", s.double_frees) &&
            put("replaced", s.replaced) && put("reentrant_skipped", s.reentrant_skipped) &&
            put("dropped_table_full", s.dropped_table_full) && put("dropped_stacks", s.dropped_stacks) &&
            put("distinct_stacks", s.distinct_stacks) && put("distinct_functions", s.distinct_functions) &&
            put("dropped_functions", s.dropped_functions);
  if (!ok) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

PyMethodDef g_methods[] = {
    {"record_allocation", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(RecordAllocation)),
     METH_VARARGS | METH_KEYWORDS,
     "record_allocation(obj_or_ptr, nbytes=None, device='cpu:0', kind='buffer') -> int\n\n"
     "Records a live buffer (an int address, or an object with the buffer protocol: its data, its length by "
     "default) with the calling Python stack. Returns the address."},
    {"record_free", RecordFree, METH_O, "record_free(obj_or_ptr): the buffer recorded at that address is gone."},
    {"track_numpy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(TrackNumpy)),
     METH_VARARGS | METH_KEYWORDS,
     "track_numpy(enable=True) -> bool: record numpy array data (all threads) with Python stacks; "
     "returns the previous setting."},
    {"numpy_tracking", NumpyTracking, METH_NOARGS, "Whether numpy arrays are being recorded."},
    {"_numpy_hook_state", NumpyHookState, METH_NOARGS,
     "'removed' (numpy's handler untouched), 'tracking', or 'draining' (not recording; wrappers stay until the "
     "arrays recorded are freed and track_numpy(False) is called again)."},
    {"tracking_stats", TrackingStats, METH_NOARGS, "spyglass::memory::tracking_stats() as a dict."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// GPU allocations made from Python (CUPTI callbacks on this thread): the
// Python stack, when the thread holds the GIL.
int PythonStackForGpu(uintptr_t* words, int max) {
  if (t_walking || !Py_IsInitialized() || !PyGILState_Check()) return 0;
  t_walking = true;
  int n = WalkPythonStack(words, max);
  t_walking = false;
  return n;
}

bool AddPythonMemory(PyObject* module) {
  gpu::SetAllocationStackHook(&PythonStackForGpu);
  g_fn_extra = SG_REQUEST_EXTRA(nullptr);
  if (g_fn_extra < 0) PyErr_Clear();  // works without the cache, only slower
  PyObject* name = PyModule_GetNameObject(module);
  if (name == nullptr) return false;
  for (PyMethodDef* d = g_methods; d->ml_name != nullptr; ++d) {
    PyObject* f = PyCFunction_NewEx(d, nullptr, name);
    if (f == nullptr) {
      Py_DECREF(name);
      return false;
    }
    if (PyModule_AddObject(module, d->ml_name, f) < 0) {
      Py_DECREF(f);
      Py_DECREF(name);
      return false;
    }
  }
  Py_DECREF(name);
  return true;
}

}  // namespace spyglass::python
