// Python frames in the heap hook's stacks, for unmodified Python programs.
//
// `spyglass run` puts a startup module (python/spyglass_python_startup/
// sitecustomize.py) on PYTHONPATH. Once the interpreter is up, it calls
// spyglass_heap_python_start() below through ctypes (GIL held). From then on:
//   - CPython's three allocator domains (PYMEM_DOMAIN_RAW, MEM, OBJ) are
//     wrapped (PyMem_SetAllocator): each block is recorded with its stack, and
//     the malloc underneath (pymalloc's large blocks, the raw domain) is not
//     recorded a second time;
//   - every allocation, in those wrappers and in the hook's malloc (native
//     extensions), gets the allocating thread's Python frames (function,
//     file, line) spliced into its native stack in place of the interpreter's
//     eval-loop frames (_PyEval_EvalFrameDefault), as memray shows them.
// Light mode (SPYGLASS_PYTHON_MODE=light, `--python-mode light`): instead, the
// hook's malloc blocks and pymalloc's arenas, each with the Python frames
// alone (memray's default mode; see "light mode" below).
// When the main program ends (the startup module's atexit handler, which runs
// last), Python frames stop and the exit snapshot is written: the live set of
// the program, not what the interpreter's teardown leaves.
//
// No Python headers and nothing loaded: libpython's exported functions are
// looked up (dlsym) only when a Python program calls in, so one hook serves
// CPython 3.10 to 3.13 alike, and a program that is not Python never touches
// any of this. Frames are read only by a thread that holds the GIL (its
// thread state is the attached one); a thread without it (a native extension
// that released the GIL) records its native stack only. 3.11-3.13: read in
// place from the interpreter's frame structs (WalkPythonRaw: their layouts per
// version, checked at start against the public API); 3.10, or a Python whose
// layout disagrees, or SPYGLASS_PYTHON_FRAME_WALK=api: the public C API
// (PyThreadState_GetFrame, PyFrame_GetBack/GetCode/GetLineNumber), which on
// 3.11+ makes a frame object per frame read (kept by the frame, freed with
// it; the collector is disabled meanwhile so that this allocation cannot run
// a collection inside the allocator).
//
// Interleaving: on 3.10 each Python frame is one eval-loop call, so the i-th
// eval frame of the native stack is replaced by the i-th Python frame, and the
// native frames between them (a C function that called back into Python) stay
// where they are. 3.11+ runs Python-to-Python calls inside one eval-loop call:
// when the native stack has fewer eval frames than there are Python frames,
// all Python frames go in place of the innermost eval frame and the native
// frames between eval frames are dropped (their position among the Python
// frames is not known); the native frames above the innermost eval frame (the
// allocating C code) and below the outermost (main, Py_RunMain) stay.
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "memory/heap_hook.h"
#include "memory/tracker.h"
#include "memory/unwind.h"

namespace spyglass::memory::heap {

std::atomic<bool> g_python_on{false};
std::atomic<bool> g_python_light{false};

namespace {

using namespace spyglass::memory::internal;  // NOLINT

constexpr int kMaxPythonFrames = 64;

// PyMemAllocatorEx (stable since 3.5).
struct PyAllocator {
  void* ctx;
  void* (*malloc)(void* ctx, size_t size);
  void* (*calloc)(void* ctx, size_t nelem, size_t elsize);
  void* (*realloc)(void* ctx, void* ptr, size_t new_size);
  void (*free)(void* ctx, void* ptr);
};
constexpr int kDomains = 3;  // PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ
// PyObjectArenaAllocator (stable since 3.4): pymalloc's arenas (mmap'd).
struct ArenaAllocator {
  void* ctx;
  void* (*alloc)(void* ctx, size_t size);
  void (*free)(void* ctx, void* ptr, size_t size);
};

// libpython's functions used here (all exported by 3.10-3.13).
struct Api {
  void* (*current_thread_state)();  // the thread state holding the GIL on this thread, or NULL
  void* (*this_thread_state)();
  void* (*thread_state_get_frame)(void*);
  void* (*frame_get_back)(void*);
  void* (*frame_get_code)(void*);
  int (*frame_get_line)(void*);
  int (*frame_get_lasti)(void*);  // 3.11+ (nullptr before)
  void (*decref)(void*);
  void* (*getattr)(void*, const char*);
  const char* (*utf8)(void*, ssize_t*);
  void (*err_fetch)(void**, void**, void**);
  void (*err_restore)(void*, void*, void*);
  void (*err_clear)();
  int (*gc_disable)();
  int (*gc_enable)();
  int (*get_extra)(void*, ssize_t, void**);
  int (*set_extra)(void*, ssize_t, void*);
  ssize_t (*request_extra)(void (*)(void*));
  void (*get_allocator)(int, PyAllocator*);
  void (*set_allocator)(int, PyAllocator*);
  void (*get_arena_allocator)(struct ArenaAllocator*);  // light mode only
  void (*set_arena_allocator)(struct ArenaAllocator*);
  int (*addr2line)(void*, int);  // PyCode_Addr2Line
};
Api g_api{};
ssize_t g_extra = -1;  // code-object extra slot: the interned function id
uintptr_t g_eval_lo = 0, g_eval_hi = 0;  // _PyEval_EvalFrameDefault's code
PyAllocator g_orig[kDomains];             // the wrapped allocators (ctx of ours)
ArenaAllocator g_orig_arena;              // the wrapped arena allocator (light mode)
bool g_started = false;

template <typename F>
bool Find(F* out, const char* name, const char* alt = nullptr) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (p == nullptr && alt != nullptr) p = dlsym(RTLD_DEFAULT, alt);
  *out = reinterpret_cast<F>(p);
  return p != nullptr;
}

bool ResolveApi() {
  Api& a = g_api;
  return Find(&a.current_thread_state, "PyThreadState_GetUnchecked", "_PyThreadState_UncheckedGet") &&
         Find(&a.this_thread_state, "PyGILState_GetThisThreadState") &&
         Find(&a.thread_state_get_frame, "PyThreadState_GetFrame") && Find(&a.frame_get_back, "PyFrame_GetBack") &&
         Find(&a.frame_get_code, "PyFrame_GetCode") && Find(&a.frame_get_line, "PyFrame_GetLineNumber") &&
         Find(&a.decref, "Py_DecRef") && Find(&a.getattr, "PyObject_GetAttrString") &&
         Find(&a.utf8, "PyUnicode_AsUTF8AndSize") && Find(&a.err_fetch, "PyErr_Fetch") &&
         Find(&a.err_restore, "PyErr_Restore") && Find(&a.err_clear, "PyErr_Clear") &&
         Find(&a.gc_disable, "PyGC_Disable") && Find(&a.gc_enable, "PyGC_Enable") &&
         Find(&a.get_extra, "PyUnstable_Code_GetExtra", "_PyCode_GetExtra") &&
         Find(&a.set_extra, "PyUnstable_Code_SetExtra", "_PyCode_SetExtra") &&
         Find(&a.request_extra, "PyUnstable_Eval_RequestCodeExtraIndex", "_PyEval_RequestCodeExtraIndex") &&
         Find(&a.get_allocator, "PyMem_GetAllocator") && Find(&a.set_allocator, "PyMem_SetAllocator") &&
         Find(&a.addr2line, "PyCode_Addr2Line");
}

// [start, end) of _PyEval_EvalFrameDefault, from its dynamic symbol's size.
bool FindEvalLoop() {
  void* sym = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
  Dl_info info{};
  ElfW(Sym)* ent = nullptr;
  if (sym == nullptr || dladdr1(sym, &info, reinterpret_cast<void**>(&ent), RTLD_DL_SYMENT) == 0 || ent == nullptr ||
      ent->st_size == 0)
    return false;
  g_eval_lo = reinterpret_cast<uintptr_t>(sym);
  g_eval_hi = g_eval_lo + ent->st_size;
  return true;
}

std::string_view Utf8Attr(void* obj, const char* attr, void** hold) {
  *hold = g_api.getattr(obj, attr);
  if (*hold == nullptr) {
    g_api.err_clear();
    return "<unknown>";
  }
  ssize_t n = 0;
  const char* p = g_api.utf8(*hold, &n);
  if (p == nullptr) {
    g_api.err_clear();
    return "<unknown>";
  }
  return {p, static_cast<size_t>(n)};
}

// What a code object's extra slot points at: its interned (co_name,
// co_filename) and the lines of its last few instruction offsets (a line
// lookup scans the code's line table: the cost that dominated a walk). Only
// read and written with the GIL held. In an mmap'd arena, never freed (a code
// object that dies leaves its 48 bytes); when the arena is full, code objects
// seen later are looked up in full on every walk.
constexpr int kLineWays = 4;
struct CodeInfo {
  uint32_t function;
  uint32_t next_way;
  int32_t lasti[kLineWays];
  int32_t line[kLineWays];
};
constexpr size_t kCodeInfoMax = (64u << 20) / sizeof(CodeInfo);  // 64 MiB of address space, touched as used
CodeInfo* g_code_info = nullptr;
size_t g_code_info_used = 0;

// Behind each code object's few ways, one table for all of them: (code info,
// offset) -> line, direct-mapped. A function that allocates from more than
// kLineWays places (json's pure-Python encoder: a generator yielding from a
// dozen lines) missed its ways on most walks, and each miss scanned the
// line table (PyCode_Addr2Line was 13% of json.tool's profiled time). Keyed
// by the CodeInfo's index, which is never reused (a code object's address
// is). In the same mmap'd arena as the infos; GIL held.
struct LineEntry {
  uint64_t key;  // (info index + 1) << 32 | (lasti + 2); 0: empty
  int32_t line;
};
constexpr size_t kLineEntries = size_t{1} << 18;  // 4 MiB of address space, touched as used
LineEntry* g_lines = nullptr;
inline uint64_t LineKey(const CodeInfo* info, int lasti) {
  return (static_cast<uint64_t>(info - g_code_info) + 1) << 32 | static_cast<uint32_t>(lasti + 2);
}
inline LineEntry& LineSlot(uint64_t key) { return g_lines[Mix(key) & (kLineEntries - 1)]; }

// Reading attributes may set an exception or allocate: the caller's pending
// exception is kept aside, and the collector cannot run meanwhile.
struct PythonCallScope {
  void *type, *value, *tb;
  int gc_was_on;
  PythonCallScope() {
    g_api.err_fetch(&type, &value, &tb);
    gc_was_on = g_api.gc_disable();
  }
  ~PythonCallScope() {
    if (gc_was_on) g_api.gc_enable();
    g_api.err_restore(type, value, tb);
  }
};

uint32_t InternCode(void* code) {
  PythonCallScope scope;
  void *name_obj, *file_obj;
  std::string_view name = Utf8Attr(code, "co_name", &name_obj);
  std::string_view file = Utf8Attr(code, "co_filename", &file_obj);
  uint32_t id = InternFunction(name, file);  // 0 (function table full, counted) reads "<unknown>"
  if (name_obj) g_api.decref(name_obj);
  if (file_obj) g_api.decref(file_obj);
  return id;
}

// Whether a walk may give a code object its extra slot (set_extra), or only
// read the slots already set. Setting grows the code's extra array
// (PyMem_Realloc): never inside a reallocation through CPython's allocators,
// which may be _PyCode_SetExtra growing that very array (another user of
// extras: the Python tracer, a debugger): the caller stores its new array
// after the call returns, over ours, or reallocates a block ours just freed.
// kNone: extras not even read (light mode, after a reallocation that may
// have been _PyCode_SetExtra's: the array the code object points at may be
// the freed one until its caller stores the new one).
enum class Extras { kReadWrite, kReadOnly, kNone };

CodeInfo* CodeInfoOf(void* code, Extras extras) {
  if (extras == Extras::kNone) return nullptr;
  void* extra = nullptr;
  if (g_api.get_extra(code, g_extra, &extra) == 0 && extra != nullptr) return static_cast<CodeInfo*>(extra);
  if (extras == Extras::kReadOnly || g_code_info == nullptr || g_code_info_used == kCodeInfoMax) return nullptr;
  CodeInfo* info = &g_code_info[g_code_info_used];
  info->function = InternCode(code);
  info->next_way = 0;
  for (int i = 0; i < kLineWays; ++i) info->lasti[i] = -2;  // no offset is -2
  PythonCallScope scope;
  if (g_api.set_extra(code, g_extra, info) != 0) {
    g_api.err_clear();
    return nullptr;
  }
  ++g_code_info_used;
  return info;
}

// One frame as a symbolic frame: `lasti` is the offset in bytes of its
// instruction (-1 before the first), the key of the line cache; `line_of`
// computes the line when the cache does not have it.
template <typename LineOf>
uintptr_t FrameWord(void* code, int lasti, const LineOf& line_of, Extras extras) {
  CodeInfo* info = CodeInfoOf(code, extras);
  if (info == nullptr) return SymbolicFrame(InternCode(code), line_of());
  for (int i = 0; i < kLineWays; ++i)
    if (info->lasti[i] == lasti) return SymbolicFrame(info->function, info->line[i]);
  const uint64_t key = LineKey(info, lasti);
  LineEntry& e = LineSlot(key);
  int line;
  if (e.key == key) {
    line = e.line;
  } else {
    line = line_of();
    e.key = key;
    e.line = line;
  }
  const uint32_t w = info->next_way++ % kLineWays;
  info->lasti[w] = lasti;
  info->line[w] = line;
  return SymbolicFrame(info->function, line);
}

// Whether the calling thread holds the GIL: its thread state is the one
// attached (PyGILState_Check's own test, which that function skips once
// subinterpreters exist). Returns the thread state, or null.
void* ThreadStateWithGil() {
  void* ts = g_api.current_thread_state();
  return ts != nullptr && ts == g_api.this_thread_state() ? ts : nullptr;
}

// The calling thread's Python frames, innermost first, through the public C
// API (3.10, and any Python whose frames RawLayout does not know). On 3.11+
// reading a frame may create its frame object (kept by the frame, freed with
// it); the collector is disabled meanwhile so that this allocation cannot run
// a collection inside the allocator.
int WalkPythonApi(void* ts, uintptr_t* out, int max, Extras extras) {
  PythonCallScope scope;
  int n = 0;
  void* f = g_api.thread_state_get_frame(ts);  // new reference or NULL
  while (f != nullptr && n < max) {
    void* code = g_api.frame_get_code(f);
    if (g_api.frame_get_lasti != nullptr) {
      out[n++] = FrameWord(code, g_api.frame_get_lasti(f), [&] { return g_api.frame_get_line(f); }, extras);
    } else {  // 3.10: no offset to key the line cache by
      CodeInfo* info = CodeInfoOf(code, extras);
      out[n++] = SymbolicFrame(info != nullptr ? info->function : InternCode(code), g_api.frame_get_line(f));
    }
    g_api.decref(code);
    void* back = g_api.frame_get_back(f);
    g_api.decref(f);
    f = back;
  }
  if (f != nullptr) g_api.decref(f);
  return n;
}

// ---- 3.11-3.13: the interpreter's frames read in place ---------------------
// The public API above makes a frame object for every frame it reads (3.11+
// keeps frames in a stack of plain structs): an allocation per Python call
// of the program, and more work for the collector (frame objects are tracked
// by it). memray reads the structs with the headers of the Python it was
// built for; this hook serves every Python, so it knows where 3.11, 3.12 and
// 3.13 keep the fields it needs (offsets from their headers, LP64 builds
// without Py_TRACE_REFS), and checks them at start against the public API on
// the stack of the moment: a Python where they disagree (a debug build, a
// later patch release that moved a field) keeps the public API.
struct RawLayout {
  int ts_cframe;         // PyThreadState.cframe (3.11, 3.12); -1: the frame pointer is in the thread state (3.13)
  int current_frame;     // _PyCFrame.current_frame, or PyThreadState.current_frame (3.13)
  int code, previous, instr, owner;  // _PyInterpreterFrame: f_code/f_executable, previous, prev_instr/instr_ptr, owner
  int first_traceable, code_units;   // PyCodeObject: _co_firsttraceable, co_code_adaptive
};
constexpr RawLayout kLayout311{56, 8, 32, 48, 56, 69, 168, 184};
constexpr RawLayout kLayout312{56, 0, 0, 8, 56, 70, 176, 192};
constexpr RawLayout kLayout313{-1, 72, 0, 8, 56, 70, 184, 200};
constexpr char kOwnedByGenerator = 1, kOwnedByCStack = 3;  // _PyInterpreterFrame.owner
RawLayout g_raw{};
bool g_raw_on = false;
const void* g_code_type = nullptr;  // &PyCode_Type

template <typename T>
inline T At(const void* base, int offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + offset, sizeof v);
  return v;
}

int WalkPythonRaw(void* ts, uintptr_t* out, int max, Extras extras) {
  const RawLayout& L = g_raw;
  const void* f = L.ts_cframe >= 0 ? At<const void*>(At<const void*>(ts, L.ts_cframe), L.current_frame)
                                   : At<const void*>(ts, L.current_frame);
  int n = 0;
  for (int hops = 0; f != nullptr && n < max && hops < 4 * kMaxPythonFrames; ++hops, f = At<const void*>(f, L.previous)) {
    // _PyFrame_IsIncomplete: the C stack's shim frames, and frames still in
    // their prologue (before _co_firsttraceable), are not shown by the API.
    const char owner = At<char>(f, L.owner);
    if (owner == kOwnedByCStack) continue;
    void* code = At<void*>(f, L.code);
    if (code == nullptr || At<const void*>(code, sizeof(intptr_t)) != g_code_type) continue;
    const intptr_t units =
        (At<intptr_t>(f, L.instr) - reinterpret_cast<intptr_t>(code) - L.code_units) / 2;  // _PyInterpreterFrame_LASTI
    if (owner != kOwnedByGenerator && units < At<int32_t>(code, L.first_traceable)) continue;
    const int lasti = units < 0 ? -1 : static_cast<int>(units * 2);  // PyFrame_GetLasti
    out[n++] = FrameWord(code, lasti, [&] { return g_api.addr2line(code, static_cast<int>(units * 2)); }, extras);
  }
  return n;
}

// The calling thread's Python frames, innermost first, if it holds the GIL; else none.
int WalkPython(uintptr_t* out, int max, Extras extras) {
  void* ts = ThreadStateWithGil();
  if (ts == nullptr) return 0;
  return g_raw_on ? WalkPythonRaw(ts, out, max, extras) : WalkPythonApi(ts, out, max, extras);
}

// Picks the layout of this Python (3.11-3.13) and turns the in-place walk on
// when it reads the current stack as the public API does. GIL held.
void ChooseWalk() {
  const unsigned long* version = nullptr;
  if (!Find(&version, "Py_Version") || !Find(&g_code_type, "PyCode_Type") || g_api.frame_get_lasti == nullptr) return;
  // A free-threaded build (3.13t) lays objects out differently: public API.
  if (dlsym(RTLD_DEFAULT, "_Py_MergeZeroLocalRefcount") != nullptr) return;
  switch ((*version >> 16) & 0xffff) {  // major, minor
    case 0x030b: g_raw = kLayout311; break;
    case 0x030c: g_raw = kLayout312; break;
    case 0x030d: g_raw = kLayout313; break;
    default: return;
  }
  void* ts = ThreadStateWithGil();
  if (ts == nullptr) return;
  uintptr_t api[kMaxPythonFrames], raw[kMaxPythonFrames];
  const int n = WalkPythonApi(ts, api, kMaxPythonFrames, Extras::kReadWrite);
  g_raw_on = n > 0 && WalkPythonRaw(ts, raw, kMaxPythonFrames, Extras::kReadWrite) == n &&
             std::memcmp(api, raw, sizeof(uintptr_t) * n) == 0;
}

inline bool IsEvalFrame(uintptr_t ret) { return ret - 1 >= g_eval_lo && ret - 1 < g_eval_hi; }

int Splice(uintptr_t* frames, int depth, int max, Extras extras);  // below

// ---- the allocator wrappers ---------------------------------------------------
// Inside the tracker already (a walk creating a frame object, a snapshot): the
// call passes through. Else the wrapped allocator runs as "own work" (the
// hook's malloc underneath records nothing, counts nothing), then the block is
// recorded here with the full stack.
//
// A reallocation walks the stack before the call instead, with extra slots
// read only (Extras): the caller may be _PyCode_SetExtra growing the extra
// array of a code object on this very stack (the Python tracer naming, at its
// first traced call, a function whose outer call is running: importlib's
// _find_and_load in a nested import, runpy's _run_code). Once the call
// returns, that array is freed while the code object points at it until the
// caller stores the new one: a walk after the call read freed memory as the
// extras and wrote through what it found (SIGSEGV in a traced JAX program).

__attribute__((noinline)) void RecordHere(void* p, size_t n, void* frame) {
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return;
  }
  PrefetchInsert(reinterpret_cast<uintptr_t>(p));  // lands while the stacks are walked
  uintptr_t frames[kMaxFrames];
  int depth = CaptureNative(frame, frames, kMaxFrames / 2);
  depth = Splice(frames, depth, kMaxFrames, Extras::kReadWrite);
  Record(reinterpret_cast<uintptr_t>(p), n, HeapClass(), frames, depth);
  Guard::Leave();
}

// The stack of a block not allocated yet (a reallocation): its depth, or -1
// inside the tracker. Same frame count as RecordHere (CaptureNative's note).
__attribute__((noinline)) int CaptureBefore(uintptr_t* frames, void* frame) {
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return -1;
  }
  int depth = CaptureNative(frame, frames, kMaxFrames / 2);
  depth = Splice(frames, depth, kMaxFrames, Extras::kReadOnly);
  Guard::Leave();
  return depth;
}

void RecordCaptured(void* p, size_t n, const uintptr_t* frames, int depth) {
  if (!Guard::Enter()) return;
  Record(reinterpret_cast<uintptr_t>(p), n, HeapClass(), frames, depth);
  Guard::Leave();
}

// An allocation through CPython's allocators failed (it raises MemoryError
// next): the dump, with the Python frames of the stack.
__attribute__((noinline)) void FailedHere(size_t n, void* frame, Extras extras) {
  if (!AllocationFailureWanted(n) || !Guard::Enter()) return;
  uintptr_t frames[kMaxFrames];
  int depth = CaptureNative(frame, frames, kMaxFrames / 2);
  depth = Splice(frames, depth, kMaxFrames, extras);
  Guard::Leave();
  AllocationFailed(n, frames, depth);
}

void Forget(void* p) {
  if (p == nullptr || !MaybeTrackedFree(p) || !Guard::Enter()) return;
  RemoveIfTracked(reinterpret_cast<uintptr_t>(p));  // blocks from before the start are not unknown frees
  Guard::Leave();
}

__attribute__((noinline)) void* WrapMalloc(void* ctx, size_t n) {
  auto* a = static_cast<PyAllocator*>(ctx);
  if (!Guard::EnterOwn()) return a->malloc(a->ctx, n);
  void* p = a->malloc(a->ctx, n);
  Guard::Leave();
  if (p != nullptr && ShouldTrack(n)) RecordHere(p, n, __builtin_frame_address(0));
  if (p == nullptr) FailedHere(n, __builtin_frame_address(0), Extras::kReadWrite);
  return p;
}

__attribute__((noinline)) void* WrapCalloc(void* ctx, size_t nelem, size_t elsize) {
  auto* a = static_cast<PyAllocator*>(ctx);
  if (!Guard::EnterOwn()) return a->calloc(a->ctx, nelem, elsize);
  void* p = a->calloc(a->ctx, nelem, elsize);
  Guard::Leave();
  size_t n = 0;
  if (p == nullptr && !__builtin_mul_overflow(nelem, elsize, &n))
    FailedHere(n, __builtin_frame_address(0), Extras::kReadWrite);
  n = nelem * elsize;  // the call succeeded: no overflow
  if (p != nullptr && ShouldTrack(n)) RecordHere(p, n, __builtin_frame_address(0));
  return p;
}

__attribute__((noinline)) void* WrapRealloc(void* ctx, void* old, size_t n) {
  auto* a = static_cast<PyAllocator*>(ctx);
  if (Guard::Inside()) return a->realloc(a->ctx, old, n);
  // Taken out before the call (then the address may be another thread's), put
  // back unchanged if the call fails.
  LiveRecord rec{};
  bool taken = false;
  if (old != nullptr && MaybeTrackedFree(old) && Guard::Enter()) {
    taken = Take(reinterpret_cast<uintptr_t>(old), &rec);
    Guard::Leave();
  }
  // The stack before the call, while every extra array is whole (see above).
  uintptr_t frames[kMaxFrames];
  const int depth = ShouldTrack(n) ? CaptureBefore(frames, __builtin_frame_address(0)) : -1;
  Guard::EnterOwn();
  void* p = a->realloc(a->ctx, old, n);
  Guard::Leave();
  if (p == nullptr) {
    if (taken && Guard::Enter()) {
      Restore(rec);
      Guard::Leave();
    }
    // The block is unchanged and still its caller's (maybe a code object's
    // extra array): extras read only here too.
    FailedHere(n, __builtin_frame_address(0), Extras::kReadOnly);
    return p;
  }
  if (depth >= 0) RecordCaptured(p, n, frames, depth);
  return p;
}

// The block goes back to its allocator at once; its erase waits a few frees
// with its table slot prefetched (RemoveLater, entered before the block is
// given back: another thread that gets the address from malloc then finds
// it waiting): the erase of a long-lived object was a cache miss on every
// free (16% of a program's profiled time).
__attribute__((noinline)) void WrapFree(void* ctx, void* p) {
  auto* a = static_cast<PyAllocator*>(ctx);
  if (Guard::Inside()) return a->free(a->ctx, p);
  if (p != nullptr && MaybeTrackedFree(p) && Guard::Enter()) {
    RemoveLater(reinterpret_cast<uintptr_t>(p));  // blocks from before the start are not unknown frees
    Guard::Leave();
  }
  Guard::EnterOwn();
  a->free(a->ctx, p);
  Guard::Leave();
}

// ---- light mode -----------------------------------------------------------------
// The blocks malloc sees and pymalloc's arenas (what memray's default mode
// shows of pymalloc: its mmaps), each with the Python frames alone; the
// objects pymalloc serves from its pools are not recorded one by one.
// A block made inside pymalloc (a new arena, the realloc of its arena
// table, a large object's malloc) cannot have its frames read there: reading
// them may allocate (a code object's names and extra slot) and pymalloc is
// in the middle of changing its own state. So the MEM and OBJ domains are
// wrapped by pass-throughs that mark the call (t_light_defer); a block made
// inside one is put aside (t_stash) and recorded, with the frames, once
// pymalloc has returned, as full mode's wrappers record theirs.
constexpr int kStash = 8;
struct Stashed {
  uintptr_t ptr;
  uint64_t size;
};
constinit thread_local int t_light_defer __attribute__((tls_model("initial-exec"))) = 0;
constinit thread_local int t_stash_n __attribute__((tls_model("initial-exec"))) = 0;
constinit thread_local Stashed t_stash[kStash] __attribute__((tls_model("initial-exec"))) = {};

// Records the blocks put aside, all with the stack of now. Guard not held.
__attribute__((noinline)) void FlushStash(void* frame, Extras extras) {
  if (!Guard::Enter()) return;  // t_stash_n > 0 implies tracking was wanted
  uintptr_t frames[kMaxFrames];
  const int guard = Guard::BeginOwn();
  int depth = WalkPython(frames, kMaxPythonFrames, extras);
  Guard::Restore(guard);
  if (depth == 0) depth = CaptureNative(frame, frames, kMaxFrames / 2);
  for (int i = 0; i < t_stash_n; ++i) Record(t_stash[i].ptr, t_stash[i].size, HeapClass(), frames, depth);
  t_stash_n = 0;
  Guard::Leave();
}

__attribute__((noinline)) void* LightMalloc(void* ctx, size_t n) {
  auto* a = static_cast<PyAllocator*>(ctx);
  ++t_light_defer;
  void* p = a->malloc(a->ctx, n);
  if (--t_light_defer == 0 && __builtin_expect(t_stash_n != 0, 0)) FlushStash(__builtin_frame_address(0), Extras::kReadWrite);
  return p;
}
__attribute__((noinline)) void* LightCalloc(void* ctx, size_t nelem, size_t elsize) {
  auto* a = static_cast<PyAllocator*>(ctx);
  ++t_light_defer;
  void* p = a->calloc(a->ctx, nelem, elsize);
  if (--t_light_defer == 0 && __builtin_expect(t_stash_n != 0, 0)) FlushStash(__builtin_frame_address(0), Extras::kReadWrite);
  return p;
}
// The caller may be _PyCode_SetExtra growing a code object's extras (see
// the full mode's WrapRealloc): the frames are read without the extras.
__attribute__((noinline)) void* LightRealloc(void* ctx, void* old, size_t n) {
  auto* a = static_cast<PyAllocator*>(ctx);
  ++t_light_defer;
  void* p = a->realloc(a->ctx, old, n);
  if (--t_light_defer == 0 && __builtin_expect(t_stash_n != 0, 0)) FlushStash(__builtin_frame_address(0), Extras::kNone);
  return p;
}
__attribute__((noinline)) void LightFree(void* ctx, void* p) {
  auto* a = static_cast<PyAllocator*>(ctx);
  a->free(a->ctx, p);
}

__attribute__((noinline)) void* WrapArenaAlloc(void* ctx, size_t n) {
  auto* a = static_cast<ArenaAllocator*>(ctx);
  // Our own work: an arena allocator built on malloc (no mmap) is not recorded twice.
  if (!Guard::EnterOwn()) return a->alloc(a->ctx, n);
  void* p = a->alloc(a->ctx, n);
  Guard::Leave();
  if (p != nullptr && ShouldTrack(n) && Guard::Enter()) {
    if (!StashLightBlock(p, n)) {
      // Outside the domains (a direct call): recorded now, native frames only (nothing of Python is read).
      uintptr_t frames[kMaxFrames];
      const int depth = CaptureNative(__builtin_frame_address(0), frames, kMaxFrames / 2);
      Record(reinterpret_cast<uintptr_t>(p), n, HeapClass(), frames, depth);
    }
    Guard::Leave();
  }
  return p;
}

__attribute__((noinline)) void WrapArenaFree(void* ctx, void* p, size_t n) {
  auto* a = static_cast<ArenaAllocator*>(ctx);
  if (Guard::Inside()) return a->free(a->ctx, p, n);
  if (!UnstashLightBlock(p)) Forget(p);  // put aside and freed in the same call: never recorded
  Guard::EnterOwn();
  a->free(a->ctx, p, n);
  Guard::Leave();
}

int Splice(uintptr_t* frames, int depth, int max, Extras extras) {
  if (!g_python_on.load(std::memory_order_acquire)) return depth;
  // What the walk allocates (a frame object, the extra slot) is the
  // profiler's doing: untracked and not counted, as the profiler's own work.
  const int guard = Guard::BeginOwn();
  uintptr_t py[kMaxPythonFrames];
  const int np = WalkPython(py, kMaxPythonFrames, extras);
  Guard::Restore(guard);
  if (np == 0) return depth;
  int evals = 0, first = -1, last = -1;
  for (int i = 0; i < depth; ++i) {
    if (!IsEvalFrame(frames[i])) continue;
    if (first < 0) first = i;
    last = i;
    ++evals;
  }
  uintptr_t out[kMaxFrames];
  int n = 0;
  auto put = [&](uintptr_t w) {
    if (n < max && n < kMaxFrames) out[n++] = w;
  };
  if (evals == np) {  // one Python frame per eval-loop call, in order
    for (int i = 0, j = 0; i < depth; ++i) put(IsEvalFrame(frames[i]) ? py[j++] : frames[i]);
  } else if (evals == 0) {  // the native walk did not reach the eval loop
    for (int i = 0; i < depth; ++i) put(frames[i]);
    for (int j = 0; j < np; ++j) put(py[j]);
  } else {
    for (int i = 0; i < first; ++i) put(frames[i]);
    for (int j = 0; j < np; ++j) put(py[j]);
    for (int i = last + 1; i < depth; ++i) put(frames[i]);
  }
  std::memcpy(frames, out, sizeof(uintptr_t) * static_cast<size_t>(n));
  return n;
}

}  // namespace

int SplicePythonFrames(uintptr_t* frames, int depth, int max) {
  return Splice(frames, depth, max, Extras::kReadWrite);
}

bool StashLightBlock(void* p, size_t n) {
  if (t_light_defer == 0) return false;
  if (__builtin_expect(t_stash_n == kStash, 0)) {
    // Never seen (a call makes a few): recorded now, without a stack (nothing may be read here).
    Record(reinterpret_cast<uintptr_t>(p), n, HeapClass(), nullptr, 0);
    return true;
  }
  t_stash[t_stash_n++] = {reinterpret_cast<uintptr_t>(p), n};
  return true;
}

bool UnstashLightBlock(void* p) {
  for (int i = 0; i < t_stash_n; ++i) {
    if (t_stash[i].ptr != reinterpret_cast<uintptr_t>(p)) continue;
    t_stash[i] = t_stash[--t_stash_n];
    return true;
  }
  return false;
}

int PythonFramesOnly(uintptr_t* frames, int max, bool moving) {
  if (!g_python_on.load(std::memory_order_acquire)) return 0;
  const int guard = Guard::BeginOwn();  // what the walk allocates is the profiler's (see Splice)
  const int n = WalkPython(frames, max < kMaxPythonFrames ? max : kMaxPythonFrames,
                           moving ? Extras::kReadOnly : Extras::kReadWrite);
  Guard::Restore(guard);
  return n;
}

}  // namespace spyglass::memory::heap

namespace heap = spyglass::memory::heap;

// Called by the startup module through ctypes, GIL held. Returns 0 when Python
// frames are on, else a reason: 1 the hook does not track (SPYGLASS_HEAP=0),
// 2 a libpython function is missing, 3 no code-object extra slot.
// `mode`: 1 (full) wraps the three PyMem domains: every object, Python frames
// spliced into native stacks; 0: only the hook's malloc gets Python frames;
// 2 (light, memray's default mode): the hook's malloc and pymalloc's arenas,
// with the Python frames alone (no native walk).
extern "C" __attribute__((visibility("default"))) int spyglass_heap_python_start(int mode) {
  using namespace heap;  // NOLINT
  namespace mi = spyglass::memory::internal;
  if (g_started) return 0;
  mi::ScopedUntracked untracked;
  if (!ResolveApi()) return 2;
  g_extra = g_api.request_extra(nullptr);
  if (g_extra < 0) {
    g_api.err_clear();
    return 3;
  }
  Find(&g_api.frame_get_lasti, "PyFrame_GetLasti");  // optional
  void* arena = mmap(nullptr, kCodeInfoMax * sizeof(CodeInfo) + kLineEntries * sizeof(LineEntry),
                     PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  g_code_info = arena == MAP_FAILED ? nullptr : static_cast<CodeInfo*>(arena);
  if (g_code_info != nullptr) g_lines = reinterpret_cast<LineEntry*>(g_code_info + kCodeInfoMax);
  FindEvalLoop();  // without it, Python frames go above the native stack
  // SPYGLASS_PYTHON_FRAME_WALK=api: the public API's walk only (for comparisons).
  if (const char* w = getenv("SPYGLASS_PYTHON_FRAME_WALK"); w == nullptr || strcmp(w, "api") != 0) ChooseWalk();
  if (mode == 2) {
    if (Find(&g_api.get_arena_allocator, "PyObject_GetArenaAllocator") &&
        Find(&g_api.set_arena_allocator, "PyObject_SetArenaAllocator")) {
      g_api.get_arena_allocator(&g_orig_arena);
      ArenaAllocator ours{&g_orig_arena, WrapArenaAlloc, WrapArenaFree};
      g_api.set_arena_allocator(&ours);
    }
    for (int d = 1; d < kDomains; ++d) {  // MEM and OBJ: pymalloc's (the raw domain is malloc)
      g_api.get_allocator(d, &g_orig[d]);
      PyAllocator ours{&g_orig[d], LightMalloc, LightCalloc, LightRealloc, LightFree};
      g_api.set_allocator(d, &ours);
    }
    g_python_light.store(true, std::memory_order_relaxed);
  }
  if (mode == 1) {
    for (int d = 0; d < kDomains; ++d) {
      g_api.get_allocator(d, &g_orig[d]);
      PyAllocator ours{&g_orig[d], WrapMalloc, WrapCalloc, WrapRealloc, WrapFree};
      g_api.set_allocator(d, &ours);
    }
  }
  g_started = true;
  g_python_on.store(true, std::memory_order_release);
  return 0;
}

// How Python frames are read: 0 none (not started), 1 the public C API, 2 in
// place (3.11-3.13). For tests and diagnostics (ctypes, GIL held).
extern "C" __attribute__((visibility("default"))) int spyglass_heap_python_walk() {
  return !heap::g_started ? 0 : heap::g_raw_on ? 2 : 1;
}

// Called by the startup module's atexit handler (the last to run, GIL held):
// the main program has ended. Python frames stop (the interpreter's teardown
// follows) and the exit snapshot is written now.
extern "C" __attribute__((visibility("default"))) void spyglass_heap_python_exit() {
  heap::g_python_on.store(false, std::memory_order_release);
  heap::WriteExitSnapshotOnce();
}
