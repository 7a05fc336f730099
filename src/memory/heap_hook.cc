// libspyglass_heap.so: tracks the host heap of an unmodified program.
//
//   LD_PRELOAD=libspyglass_heap.so SPYGLASS_HEAP_PROFILE_DIR=/tmp/mem ./prog
//   spyglass run --memory -- ./prog          (sets the same up)
//
// It defines malloc/free/calloc/realloc/memalign/posix_memalign/aligned_alloc/
// valloc/pvalloc and every operator new/delete, forwards to glibc's
// __libc_* functions and records each allocation (device "cpu:0", kind
// "heap") with its stack in the tracker of libspyglass.
//
// Environment:
//   SPYGLASS_HEAP=0                  load but do not track
//   SPYGLASS_HEAP_SAMPLE_BYTES=N     track one allocation per N bytes on average
//                                    (Poisson, as tcmalloc; profiles are scaled back)
//   SPYGLASS_HEAP_PROFILE_DIR=D      write D/memory.<pid>.exit.prof at exit and
//                                    D/memory.<pid>.<n>.prof on each SIGUSR2
//   SPYGLASS_TRACE_DIR=D             run a trace session from load to exit into D
//                                    (the trace shows a live-bytes counter track)
//   SPYGLASS_UNWINDER=fp|libunwind|glibc
//
// The hook is compiled with frame pointers; stacks are complete through
// code that keeps them (see unwind.h).
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "memory/tracker.h"
#include "memory/unwind.h"
#include "spyglass/memory.h"
#include "spyglass/profiler.h"

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void* __libc_valloc(size_t);
void* __libc_pvalloc(size_t);
}

namespace {

using namespace spyglass::memory::internal;  // NOLINT

constexpr int kHeapFrames = 64;

// 0 unknown, 1 on, 2 off
std::atomic<int> g_heap_state{0};
std::atomic<uint32_t> g_heap_class{0};
uint64_t g_interval = 0;

constinit thread_local int64_t t_until_sample __attribute__((tls_model("initial-exec"))) = 0;
constinit thread_local uint64_t t_rng __attribute__((tls_model("initial-exec"))) = 0;

int InitState() {
  const char* e = getenv("SPYGLASS_HEAP");
  int s = (e && e[0] == '0') ? 2 : 1;
  if (const char* iv = getenv("SPYGLASS_HEAP_SAMPLE_BYTES")) {
    g_interval = strtoull(iv, nullptr, 10);
    if (g_interval > 0) SetSampleInterval(g_interval);
  }
  g_heap_state.store(s, std::memory_order_release);
  return s;
}

inline bool HeapOn() {
  int s = g_heap_state.load(std::memory_order_relaxed);
  if (__builtin_expect(s == 0, 0)) s = InitState();
  return s == 1;
}

uint32_t HeapClass() {
  uint32_t c = g_heap_class.load(std::memory_order_relaxed);
  if (__builtin_expect(c == 0, 0)) {
    c = InternClass("cpu:0", "heap");
    g_heap_class.store(c, std::memory_order_relaxed);
  }
  return c;
}

// Exponential gap with mean g_interval (xorshift per thread).
int64_t NextGap() {
  if (t_rng == 0) t_rng = reinterpret_cast<uintptr_t>(&t_rng) * 0x9E3779B97F4A7C15ull | 1;
  t_rng ^= t_rng << 13;
  t_rng ^= t_rng >> 7;
  t_rng ^= t_rng << 17;
  double u = (static_cast<double>(t_rng >> 11) + 0.5) / 9007199254740992.0;
  return static_cast<int64_t>(-std::log(u) * static_cast<double>(g_interval)) + 1;
}

// Sampled mode: whether this allocation is one of the samples.
inline bool Sampled(size_t n) {
  if (g_interval == 0) return true;
  t_until_sample -= static_cast<int64_t>(n);
  if (__builtin_expect(t_until_sample > 0, 1)) return false;
  t_until_sample = NextGap();
  return true;
}

// The recording half, out of line: the inline fast path of every hooked call
// stays a few instructions (no 512-byte frame array, no stack protector).
// `frame` is the hooked function's own frame, so the stack starts at its
// caller whichever unwinder runs (libunwind/glibc skip themselves, this
// function and the hook).
__attribute__((noinline)) void TrackSlow(void* p, size_t n, void* frame) {
  if (Guard::Enter()) {
    uintptr_t frames[kHeapFrames];
    int depth;
    switch (CurrentUnwinder()) {
      case Unwinder::kFramePointer: depth = CaptureFramePointers(frame, frames, kHeapFrames); break;
      case Unwinder::kLibunwind: depth = CaptureLibunwind(frames, kHeapFrames, 3); break;
      default: depth = CaptureGlibc(frames, kHeapFrames, 3); break;
    }
    Record(reinterpret_cast<uintptr_t>(p), n, HeapClass(), frames, depth);
    Guard::Leave();
  } else if (Guard::InsideTracking()) {
    Count(kReentrant);
  }
}

#define SPYGLASS_TRACK(p, n)                                                      \
  do {                                                                            \
    if ((p) && HeapOn() && Sampled(n)) TrackSlow((p), (n), __builtin_frame_address(0)); \
  } while (0)

__attribute__((noinline)) void UntrackSlow(void* p) {
  if (Guard::Enter()) {
    Remove(reinterpret_cast<uintptr_t>(p));
    Guard::Leave();
  } else if (Guard::InsideTracking()) {
    Count(kReentrant);
  }
}

inline void Untrack(void* p) {
  if (!p || !HeapOn()) return;
  // Sampled mode: most freed blocks were never sampled; the filter says so
  // without leaving this library.
  if (g_interval && !MaybeTrackedInline(reinterpret_cast<uintptr_t>(p))) return;
  UntrackSlow(p);
}

void* NewOrThrow(size_t n, bool nothrow) {
  while (true) {
    void* p = __libc_malloc(n);
    if (p) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    h();
  }
}

void* AlignedNewOrThrow(size_t n, size_t align, bool nothrow) {
  while (true) {
    void* p = __libc_memalign(align, n);
    if (p) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    h();
  }
}

// ---- snapshots on exit and SIGUSR2 ------------------------------------------
std::string* g_dir = nullptr;
sem_t g_sem;
std::atomic<int> g_snapshots{0};
bool g_trace = false;

void WriteSnapshot(const char* tag) {
  if (!g_dir) return;
  ScopedUntracked untracked;
  std::string path = *g_dir + "/memory." + std::to_string(getpid()) + "." + tag + ".prof";
  spyglass::Status s = spyglass::profiler::save_device_memory_profile(path);
  if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.ToString().c_str());
}

void* SnapshotThread(void*) {
  while (true) {
    if (sem_wait(&g_sem) != 0) {
      if (errno == EINTR) continue;
      return nullptr;
    }
    WriteSnapshot(std::to_string(g_snapshots.fetch_add(1) + 1).c_str());
  }
}

void OnSigusr2(int) {
  int saved = errno;
  sem_post(&g_sem);  // async-signal-safe; the snapshot thread does the work
  errno = saved;
}

__attribute__((constructor)) void HeapInit() {
  ScopedUntracked untracked;
  HeapOn();
  if (const char* d = getenv("SPYGLASS_HEAP_PROFILE_DIR"); d && *d) {
    g_dir = new std::string(d);
    mkdir(d, 0755);  // the last component, if missing
    sem_init(&g_sem, 0, 0);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);  // the helper thread takes no signals of the program
    if (pthread_create(&th, &attr, SnapshotThread, nullptr) == 0) {
      struct sigaction sa {};
      sa.sa_handler = OnSigusr2;
      sa.sa_flags = SA_RESTART;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGUSR2, &sa, nullptr);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
  }
  if (const char* t = getenv("SPYGLASS_TRACE_DIR"); t && *t) {
    spyglass::Status s = spyglass::profiler::start_trace(t, {.create_perfetto_trace = true});
    if (!s.ok())
      std::fprintf(stderr, "spyglass: cannot start the trace: %s\n", s.ToString().c_str());
    else
      g_trace = true;
  }
}

__attribute__((destructor)) void HeapFini() {
  ScopedUntracked untracked;
  if (g_trace) {
    g_trace = false;
    spyglass::Status s = spyglass::profiler::stop_trace();
    if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.ToString().c_str());
  }
  WriteSnapshot("exit");
}

}  // namespace

#define SPYGLASS_HOOK extern "C" __attribute__((visibility("default"), noinline))

SPYGLASS_HOOK void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  SPYGLASS_TRACK(p, n);
  return p;
}
SPYGLASS_HOOK void free(void* p) {
  Untrack(p);
  __libc_free(p);
}
SPYGLASS_HOOK void* calloc(size_t n, size_t m) {
  void* p = __libc_calloc(n, m);
  SPYGLASS_TRACK(p, n * m);
  return p;
}
SPYGLASS_HOOK void* realloc(void* old, size_t n) {
  Untrack(old);
  void* p = __libc_realloc(old, n);
  if (p == nullptr && n != 0 && old != nullptr) {
    SPYGLASS_TRACK(old, n);  // still held (a best guess of its size)
    return p;
  }
  SPYGLASS_TRACK(p, n);
  return p;
}
SPYGLASS_HOOK void* reallocarray(void* old, size_t n, size_t m) {
  size_t bytes;
  if (__builtin_mul_overflow(n, m, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  Untrack(old);
  void* p = __libc_realloc(old, bytes);
  SPYGLASS_TRACK(p, bytes);
  return p;
}
SPYGLASS_HOOK void* memalign(size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  SPYGLASS_TRACK(p, n);
  return p;
}
SPYGLASS_HOOK void* aligned_alloc(size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  SPYGLASS_TRACK(p, n);
  return p;
}
SPYGLASS_HOOK int posix_memalign(void** out, size_t align, size_t n) {
  if (align % sizeof(void*) != 0 || (align & (align - 1)) != 0 || align == 0) return EINVAL;
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  SPYGLASS_TRACK(p, n);
  *out = p;
  return 0;
}
SPYGLASS_HOOK void* valloc(size_t n) {
  void* p = __libc_valloc(n);
  SPYGLASS_TRACK(p, n);
  return p;
}
SPYGLASS_HOOK void* pvalloc(size_t n) {
  void* p = __libc_pvalloc(n);
  SPYGLASS_TRACK(p, n);
  return p;
}

// operator new/delete (all standard forms).
#define SPYGLASS_NEW_BODY(n, nothrow)     \
  void* p = NewOrThrow((n), (nothrow));   \
  SPYGLASS_TRACK(p, n);                   \
  return p
#define SPYGLASS_ANEW_BODY(n, a, nothrow)                           \
  void* p = AlignedNewOrThrow((n), static_cast<size_t>(a), (nothrow)); \
  SPYGLASS_TRACK(p, n);                                             \
  return p

__attribute__((visibility("default"), noinline)) void* operator new(size_t n) { SPYGLASS_NEW_BODY(n, false); }
__attribute__((visibility("default"), noinline)) void* operator new[](size_t n) { SPYGLASS_NEW_BODY(n, false); }
__attribute__((visibility("default"), noinline)) void* operator new(size_t n, const std::nothrow_t&) noexcept {
  SPYGLASS_NEW_BODY(n, true);
}
__attribute__((visibility("default"), noinline)) void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  SPYGLASS_NEW_BODY(n, true);
}
__attribute__((visibility("default"), noinline)) void* operator new(size_t n, std::align_val_t a) {
  SPYGLASS_ANEW_BODY(n, a, false);
}
__attribute__((visibility("default"), noinline)) void* operator new[](size_t n, std::align_val_t a) {
  SPYGLASS_ANEW_BODY(n, a, false);
}
__attribute__((visibility("default"), noinline)) void* operator new(size_t n, std::align_val_t a,
                                                                  const std::nothrow_t&) noexcept {
  SPYGLASS_ANEW_BODY(n, a, true);
}
__attribute__((visibility("default"), noinline)) void* operator new[](size_t n, std::align_val_t a,
                                                                    const std::nothrow_t&) noexcept {
  SPYGLASS_ANEW_BODY(n, a, true);
}

#define SPYGLASS_DELETE_BODY(p) \
  Untrack(p);                   \
  __libc_free(p)
__attribute__((visibility("default"))) void operator delete(void* p) noexcept { SPYGLASS_DELETE_BODY(p); }
__attribute__((visibility("default"))) void operator delete[](void* p) noexcept { SPYGLASS_DELETE_BODY(p); }
__attribute__((visibility("default"))) void operator delete(void* p, size_t) noexcept { SPYGLASS_DELETE_BODY(p); }
__attribute__((visibility("default"))) void operator delete[](void* p, size_t) noexcept { SPYGLASS_DELETE_BODY(p); }
__attribute__((visibility("default"))) void operator delete(void* p, const std::nothrow_t&) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete[](void* p, const std::nothrow_t&) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete(void* p, std::align_val_t) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete[](void* p, std::align_val_t) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete(void* p, size_t, std::align_val_t) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
__attribute__((visibility("default"))) void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  SPYGLASS_DELETE_BODY(p);
}
