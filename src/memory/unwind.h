// Stack capture for allocations. Three unwinders, chosen once per process
// (SPYGLASS_UNWINDER=fp|libunwind|glibc; default fp, the fastest, see
// BENCHMARKS.md "Memory"):
//   fp        frame-pointer walk, bounded by the thread's stack. Complete only
//             through code built with -fno-omit-frame-pointer; a frame without
//             one ends (or skips part of) the stack, never a crash.
//   libunwind unw_backtrace (DWARF CFI, correct without frame pointers).
//   glibc     backtrace() (libgcc's DWARF unwinder).
// The capture is inlined into the hook so that frame 0 is the hook's caller.
#pragma once

#include <atomic>
#include <cstdint>

#include "memory/tracker.h"

namespace spyglass::memory::internal {

enum class Unwinder : int { kFramePointer = 0, kLibunwind = 1, kGlibc = 2 };
SPYGLASS_MEM_EXPORT extern std::atomic<int> g_unwinder;  // -1 until first read
SPYGLASS_MEM_EXPORT Unwinder CurrentUnwinderSlow();
inline Unwinder CurrentUnwinder() {
  int u = g_unwinder.load(std::memory_order_relaxed);
  if (__builtin_expect(u >= 0, 1)) return static_cast<Unwinder>(u);
  return CurrentUnwinderSlow();
}
SPYGLASS_MEM_EXPORT void SetUnwinder(Unwinder u);

struct StackBounds {
  uintptr_t lo, hi;
};
struct StackBoundsCache {
  uintptr_t lo, hi;
  bool known;
};
SPYGLASS_MEM_EXPORT extern constinit thread_local StackBoundsCache t_bounds __attribute__((tls_model("initial-exec")));
SPYGLASS_MEM_EXPORT StackBounds ThreadStackBoundsSlow();
// The calling thread's stack (cached per thread; {0,0} when unknown).
inline StackBounds ThreadStackBounds() {
  if (__builtin_expect(t_bounds.known, 1)) return {t_bounds.lo, t_bounds.hi};
  return ThreadStackBoundsSlow();
}

// DWARF-based captures (out of line); `skip` frames of their own dropped.
SPYGLASS_MEM_EXPORT int CaptureLibunwind(uintptr_t* out, int max, int skip);
SPYGLASS_MEM_EXPORT int CaptureGlibc(uintptr_t* out, int max, int skip);

// Walks frame pointers starting at `fp` (the hook's own frame).
__attribute__((always_inline, no_sanitize_address)) inline int CaptureFramePointers(void* fp, uintptr_t* out,
                                                                                       int max) {
  StackBounds b = ThreadStackBounds();
  uintptr_t p = reinterpret_cast<uintptr_t>(fp);
  if (b.hi == 0) return 0;
  int n = 0;
  while (n < max) {
    if (p < b.lo || p + 16 > b.hi || (p & 7) != 0) break;
    const uintptr_t* f = reinterpret_cast<const uintptr_t*>(p);
    uintptr_t ret = f[1];
    if (ret < 4096) break;
    out[n++] = ret;
    uintptr_t next = f[0];
    if (next <= p) break;
    p = next;
  }
  return n;
}

// The same walk into `last[0..max)`, which holds the thread's previous stack
// (`last_depth` frames; entries never below 4096: ~0 at first): a frame is
// stored only where it differs, and *same is true when the whole stack is
// the previous one, so that the caller reuses that stack's site without
// hashing it or looking it up (a loop allocating from one place walks the
// same stack again and again). A frame equal to the previous one is a valid
// return address already; the frame pointers only rise, so after the first
// one only the top bound is tested. x86-64 reads a misaligned frame pointer
// (garbage, like any other) without a fault.
__attribute__((always_inline, no_sanitize_address)) inline int CaptureFramePointersCompared(
    void* fp, uintptr_t* last, int max, int last_depth, bool* same) {
  StackBounds b = ThreadStackBounds();
  uintptr_t p = reinterpret_cast<uintptr_t>(fp);
  bool diff = false;
  int n = 0;
  if (b.hi - b.lo >= 16 && p - b.lo <= b.hi - b.lo - 16 && max > 0) {
    const uintptr_t top = b.hi - 16;  // a frame at p reads p[0] and p[1]
    while (true) {
#if !defined(__x86_64__)
      if ((p & 7) != 0) break;
#endif
      const uintptr_t* f = reinterpret_cast<const uintptr_t*>(p);
      uintptr_t ret = f[1];
      if (__builtin_expect(ret != last[n], 0)) {
        if (ret < 4096) break;
        last[n] = ret;
        diff = true;
      }
      ++n;
      uintptr_t next = f[0];
      if (next <= p || next > top || n == max) break;
      p = next;
    }
  }
  *same = !diff && n == last_depth;
  return n;
}

}  // namespace spyglass::memory::internal

// Captures the stack of the caller of the function this is expanded in.
#define SPYGLASS_CAPTURE_STACK(out, max)                                                         \
  (::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kFramePointer \
       ? ::spyglass::memory::internal::CaptureFramePointers(__builtin_frame_address(0), (out), (max)) \
       : ::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kLibunwind \
             ? ::spyglass::memory::internal::CaptureLibunwind((out), (max), 2)                    \
             : ::spyglass::memory::internal::CaptureGlibc((out), (max), 2))
