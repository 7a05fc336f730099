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

#include <cstdint>

#include "memory/tracker.h"

namespace spyglass::memory::internal {

enum class Unwinder : int { kFramePointer = 0, kLibunwind = 1, kGlibc = 2 };
SPYGLASS_MEM_EXPORT Unwinder CurrentUnwinder();
SPYGLASS_MEM_EXPORT void SetUnwinder(Unwinder u);

struct StackBounds {
  uintptr_t lo, hi;
};
// The calling thread's stack (cached per thread; {0,0} when unknown).
SPYGLASS_MEM_EXPORT StackBounds ThreadStackBounds();

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

}  // namespace spyglass::memory::internal

// Captures the stack of the caller of the function this is expanded in.
#define SPYGLASS_CAPTURE_STACK(out, max)                                                         \
  (::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kFramePointer \
       ? ::spyglass::memory::internal::CaptureFramePointers(__builtin_frame_address(0), (out), (max)) \
       : ::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kLibunwind \
             ? ::spyglass::memory::internal::CaptureLibunwind((out), (max), 2)                    \
             : ::spyglass::memory::internal::CaptureGlibc((out), (max), 2))
