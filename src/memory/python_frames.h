// Reading a thread's Python frames in place, shared by the heap hook
// (heap_python.cc) and the CPU sampler (sampling/python_stacks.cc): where
// CPython 3.10-3.13 keep the fields a walk needs (offsets from their headers,
// LP64 builds without Py_TRACE_REFS; each user checks them against the public
// C API before trusting them), the walk itself, and the splicing of the
// Python frames among the native ones at the eval loop's frames.
//
// The walk reads memory only: no call into Python, no allocation, no lock; it
// may run in a signal handler on the thread whose frames it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace spyglass::memory::python_frames {

struct RawLayout {
  // PyThreadState.cframe (3.11, 3.12); -1: the frame pointer is in the
  // thread state (3.13); -2: 3.10's PyThreadState.frame, a PyFrameObject chain.
  int ts_cframe;
  int current_frame;                 // _PyCFrame.current_frame, or PyThreadState.current_frame / .frame
  int code, previous, instr, owner;  // f_code/f_executable, previous/f_back, prev_instr/instr_ptr/f_lasti, owner
  int first_traceable, code_units;   // PyCodeObject: _co_firsttraceable, co_code_adaptive (3.11+)
};
inline constexpr RawLayout kLayout310{-2, 24, 32, 24, 96, -1, 0, 0};
inline constexpr RawLayout kLayout311{56, 8, 32, 48, 56, 69, 168, 184};
inline constexpr RawLayout kLayout312{56, 0, 0, 8, 56, 70, 176, 192};
inline constexpr RawLayout kLayout313{-1, 72, 0, 8, 56, 70, 184, 200};
inline constexpr char kOwnedByGenerator = 1, kOwnedByCStack = 3;  // _PyInterpreterFrame.owner
inline constexpr int kMaxHops = 256;  // links followed per walk (a torn chain ends there)

template <typename T>
inline T At(const void* base, int offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + offset, sizeof v);
  return v;
}

// The layout of CPython `minor` (3.minor), or null.
inline const RawLayout* LayoutOf(unsigned minor) {
  switch (minor) {
    case 10: return &kLayout310;
    case 11: return &kLayout311;
    case 12: return &kLayout312;
    case 13: return &kLayout313;
    default: return nullptr;
  }
}

// Calls on_frame(code, lasti) for each frame of thread state `ts` that the
// public API would show, innermost first, until it returns false or `max`
// frames were given. `lasti`: the byte offset of the frame's instruction, -1
// before the first (PyFrame_GetLasti's value; PyCode_Addr2Line takes it).
// `code_type`: &PyCode_Type. Each read goes through `load(dst, src, size)`,
// which returns false when it could not copy (a fault-tolerant copy, where
// the frames are another thread's: the walk ends there). Returns the number
// of frames given.
template <typename Load, typename OnFrame>
int WalkRawWith(const Load& load, const void* ts, const RawLayout& L, const void* code_type, int max,
                const OnFrame& on_frame) {
  auto rd = [&]<typename T>(const void* base, int offset, T* v) {
    return load(static_cast<void*>(v), static_cast<const char*>(base) + offset, sizeof *v);
  };
  int n = 0;
  const void* f = nullptr;
  const void* code = nullptr;
  const void* type = nullptr;
  if (L.ts_cframe == -2) {  // 3.10: frame objects
    if (!rd(ts, L.current_frame, &f)) return 0;
    for (int hops = 0; f != nullptr && n < max && hops < kMaxHops; ++hops) {
      int32_t units = 0;  // f_lasti, in code units
      if (!rd(f, L.code, &code) || !rd(f, L.instr, &units)) break;
      if (code != nullptr && rd(code, sizeof(intptr_t), &type) && type == code_type) {
        ++n;
        if (!on_frame(code, units < 0 ? -1 : units * 2)) break;
      }
      if (!rd(f, L.previous, &f)) break;
    }
    return n;
  }
  if (L.ts_cframe >= 0) {
    const void* cframe = nullptr;
    if (!rd(ts, L.ts_cframe, &cframe) || cframe == nullptr || !rd(cframe, L.current_frame, &f)) return 0;
  } else if (!rd(ts, L.current_frame, &f)) {
    return 0;
  }
  for (int hops = 0; f != nullptr && n < max && hops < kMaxHops; ++hops) {
    // _PyFrame_IsIncomplete: the C stack's shim frames, and frames still in
    // their prologue (before _co_firsttraceable), are not shown by the API.
    char owner = 0;
    intptr_t instr = 0;
    int32_t first_traceable = 0;
    if (!rd(f, L.owner, &owner) || !rd(f, L.code, &code) || !rd(f, L.instr, &instr)) break;
    if (owner != kOwnedByCStack && code != nullptr && rd(code, sizeof(intptr_t), &type) && type == code_type &&
        rd(code, L.first_traceable, &first_traceable)) {
      const intptr_t units = (instr - reinterpret_cast<intptr_t>(code) - L.code_units) / 2;  // _PyInterpreterFrame_LASTI
      if (owner == kOwnedByGenerator || units >= first_traceable) {
        ++n;
        if (!on_frame(code, units < 0 ? -1 : static_cast<int>(units * 2))) break;
      }
    }
    if (!rd(f, L.previous, &f)) break;
  }
  return n;
}

// WalkRaw's walk reading in place: the frames are the calling thread's own,
// or their thread holds still (the GIL).
template <typename OnFrame>
int WalkRaw(const void* ts, const RawLayout& L, const void* code_type, int max, const OnFrame& on_frame) {
  return WalkRawWith(
      [](void* dst, const void* src, size_t size) {
        std::memcpy(dst, src, size);
        return true;
      },
      ts, L, code_type, max, on_frame);
}

// Puts the Python frames `py` (innermost first) among the native stack
// `frames` (return addresses, innermost first) into `out` (room for `max`);
// returns its depth. On 3.10 each Python frame is one eval-loop call: the
// i-th eval frame is replaced by the i-th Python frame. 3.11+ runs
// Python-to-Python calls inside one eval-loop call: with fewer eval frames
// than Python frames, all Python frames go in place of the innermost eval
// frame and the native frames between eval frames are dropped (their place
// among the Python frames is not known); the native frames above the
// innermost eval frame and below the outermost stay. No eval frame: the
// Python frames go outside the native ones.
template <typename IsEval>
int SpliceAtEvalFrames(const uintptr_t* frames, int depth, const uintptr_t* py, int np, uintptr_t* out, int max,
                       const IsEval& is_eval) {
  int evals = 0, first = -1, last = -1;
  for (int i = 0; i < depth; ++i) {
    if (!is_eval(frames[i])) continue;
    if (first < 0) first = i;
    last = i;
    ++evals;
  }
  int n = 0;
  auto put = [&](uintptr_t w) {
    if (n < max) out[n++] = w;
  };
  if (evals == np) {
    for (int i = 0, j = 0; i < depth; ++i) put(is_eval(frames[i]) ? py[j++] : frames[i]);
  } else if (evals == 0) {
    for (int i = 0; i < depth; ++i) put(frames[i]);
    for (int j = 0; j < np; ++j) put(py[j]);
  } else {
    for (int i = 0; i < first; ++i) put(frames[i]);
    for (int j = 0; j < np; ++j) put(py[j]);
    for (int i = last + 1; i < depth; ++i) put(frames[i]);
  }
  return n;
}

}  // namespace spyglass::memory::python_frames
