#include "memory/unwind.h"

#include <execinfo.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef SPYGLASS_HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif

namespace spyglass::memory::internal {
std::atomic<int> g_unwinder{-1};
constinit thread_local StackBoundsCache t_bounds __attribute__((tls_model("initial-exec"))) = {0, 0, false};

Unwinder CurrentUnwinderSlow() {
  int u = 0;
  if (const char* e = getenv("SPYGLASS_UNWINDER")) {
#ifdef SPYGLASS_HAVE_LIBUNWIND
    if (strcmp(e, "libunwind") == 0) u = 1;
#endif
    if (strcmp(e, "glibc") == 0) u = 2;
  }
  g_unwinder.store(u, std::memory_order_relaxed);
  return static_cast<Unwinder>(u);
}

void SetUnwinder(Unwinder u) {
#ifndef SPYGLASS_HAVE_LIBUNWIND
  if (u == Unwinder::kLibunwind) u = Unwinder::kGlibc;
#endif
  g_unwinder.store(static_cast<int>(u), std::memory_order_relaxed);
}

StackBounds ThreadStackBoundsSlow() {
  t_bounds.known = true;  // set first: pthread_getattr_np may allocate (and re-enter)
  // For the main thread glibc reads /proc/self/maps (fopen, getline: about 14
  // mallocs and frees): the profiler's own work, neither tracked nor counted.
  const int guard = Guard::BeginOwn();
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
      t_bounds.lo = reinterpret_cast<uintptr_t>(addr);
      t_bounds.hi = t_bounds.lo + size;
    }
    pthread_attr_destroy(&attr);
  }
  Guard::Restore(guard);
  return {t_bounds.lo, t_bounds.hi};
}

__attribute__((noinline)) int CaptureLibunwind(uintptr_t* out, int max, int skip) {
#ifdef SPYGLASS_HAVE_LIBUNWIND
  void* buf[kMaxFrames + 4];
  int want = max + skip < kMaxFrames + 4 ? max + skip : kMaxFrames + 4;
  int n = unw_backtrace(buf, want);
  int k = 0;
  for (int i = skip; i < n; ++i) out[k++] = reinterpret_cast<uintptr_t>(buf[i]);
  return k;
#else
  return CaptureGlibc(out, max, skip);
#endif
}

__attribute__((noinline)) int CaptureGlibc(uintptr_t* out, int max, int skip) {
  void* buf[kMaxFrames + 4];
  int want = max + skip < kMaxFrames + 4 ? max + skip : kMaxFrames + 4;
  int n = backtrace(buf, want);
  int k = 0;
  for (int i = skip; i < n; ++i) out[k++] = reinterpret_cast<uintptr_t>(buf[i]);
  return k;
}

}  // namespace spyglass::memory::internal
