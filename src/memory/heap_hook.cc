// libspyglass_heap.so: tracks the host heap of an unmodified program.
//
//   LD_PRELOAD=libspyglass_heap.so SPYGLASS_HEAP_PROFILE_DIR=/tmp/mem ./prog
//   spyglass run --memory -- ./prog          (sets the same up)
//
// It defines malloc/free/calloc/realloc/memalign/posix_memalign/aligned_alloc/
// valloc/pvalloc and every operator new/delete, forwards to glibc's
// __libc_* functions and records each allocation (device "cpu:0", kind
// "heap") with its stack in the tracker (libspyglass_memory, shared with
// libspyglass when the program links it too: one tracker per process).
//
// It loads only what tracking needs (libspyglass_memory, with libc,
// libstdc++, zlib, libunwind); libspyglass (gRPC, protobuf, ...) is loaded only for
// SPYGLASS_TRACE_DIR / SERVER_PORT / FLIGHT_RECORDER, so the profiler's own
// libraries neither slow the program's start nor show in its profiles.
//
// Environment:
//   SPYGLASS_HEAP=0                  load but do not track
//   SPYGLASS_HEAP_SAMPLE_BYTES=N     track one allocation per N bytes on average
//                                    (Poisson, as tcmalloc; profiles are scaled back).
//                                    N: decimal digits, 0 (every allocation, the
//                                    default) to 1073741824 (1 GiB). Any other value
//                                    is reported on stderr and every allocation is
//                                    tracked (exact profiles).
//   SPYGLASS_HEAP_PROFILE_DIR=D      write at exit D/memory.<pid>.<comm>.exit.prof (live
//                                    now), .peak.prof (live at the high-water mark) and
//                                    D/memory.<pid>.<comm>.timeline.tsv (live bytes over
//                                    time), D/memory.<pid>.<comm>.<n>.prof on each SIGUSR2
//                                    (by a thread started at the first SIGUSR2, from the
//                                    program's next malloc/free, or at exit if none comes),
//                                    and a raw dump D/memory.<pid>.<comm>.oom.raw or
//                                    .signal.raw when an allocation fails or a fatal
//                                    signal arrives (crash_dump.h; `spyglass run`
//                                    makes pprof of it). Near a cgroup memory limit
//                                    (90% of it) D/memory.<pid>.<comm>.cgroup.prof
//                                    (the snapshot thread then runs from the start
//                                    and waits on the kernel's notifications, or
//                                    polls: cgroup_watch.h; SPYGLASS_HEAP_CGROUP_WATCH=0:
//                                    not). A failing allocation is seen in sampled
//                                    mode too (sampled or not, its site is unwound;
//                                    for the one exception, see g_fast_below).
//   SPYGLASS_HEAP_PID=P              the program being profiled: the process P
//                                    (through its execs: a launcher script that
//                                    execs its program profiles that program).
//                                    Processes it starts (fork + exec) are not
//                                    tracked unless SPYGLASS_HEAP_FOLLOW_CHILDREN=1.
//                                    Unset: the first process to load the hook sets it.
//   SPYGLASS_HEAP_FOLLOW_CHILDREN=1  children are tracked and write their own
//                                    profiles: those that exec, and those that do
//                                    not. By default a forked child (no exec)
//                                    writes files (at exit, or a dump) only once the
//                                    process that forked it is gone (a daemon: fork,
//                                    parent exits); workers of a live parent do not
//                                    (a snapshot costs a symbolization, ~50 ms).
//   SPYGLASS_TRACE_DIR, SPYGLASS_SERVER_PORT, SPYGLASS_FLIGHT_RECORDER
//                                    load libspyglass.so.0 (from the hook's
//                                    directory), which starts what they ask at
//                                    its load (src/session/env_start.h); a trace
//                                    shows a live-bytes counter track. In Python,
//                                    only if the spyglass package did not start
//                                    them (python_startup/sitecustomize.py)
//   SPYGLASS_PYTHON_MODE=light       a Python program (python_startup/): malloc's
//                                    blocks and pymalloc's arenas with Python
//                                    frames alone, not every object (heap_python.cc)
//   SPYGLASS_UNWINDER=cfi|fp|libunwind|glibc
//                                    how stacks are unwound (unwind.h). Default
//                                    cfi: .eh_frame, complete without frame
//                                    pointers (distribution binaries); fp only
//                                    for programs built with them.
//
// The hook is compiled with frame pointers: the unwinders start from the
// hooked function's frame (see unwind.h).
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <fcntl.h>

#include "common/kept_fd.h"
#include "common/signal_safe.h"
#include "memory/cgroup_watch.h"
#include "memory/crash_dump.h"
#include "memory/heap_hook.h"
#include "memory/pprof.h"
#include "memory/symbolize.h"
#include "memory/timeline.h"
#include "memory/tracker.h"
#include "memory/unwind.h"
#include "spyglass/memory.h"
#include "export/output_file.h"

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
using spyglass::memory::heap::CgroupWatch;

constexpr int kHeapFrames = 64;

// 0 unknown, 1 on, 2 off; 3 and 4: on and off with SIGUSR2 snapshots
// waiting for the snapshot thread to be started (OnSigusr2).
std::atomic<int> g_heap_state{0};
std::atomic<uint32_t> g_heap_class{0};
uint64_t g_interval = 0;
// Sampled mode with tracking on: the tracker's filter of sampled blocks, for
// free()'s fast path (one load of a hook-local, no GOT, no state check: in
// sampled mode the state only ever moves between "on" and "on, SIGUSR2
// pending", which malloc notices). nullptr otherwise.
const uint64_t* g_free_filter = nullptr;
// Sampled mode, tracking on and no SIGUSR2 snapshot waiting for its thread:
// malloc/calloc/operator new decide by the countdown alone (one flag instead
// of the state and the interval). Cleared by SIGUSR2's handler, set again
// once the snapshot thread runs (HeapStateSlow).
std::atomic<bool> g_sampling{false};

constinit thread_local int64_t t_until_sample __attribute__((tls_model("initial-exec"))) = 0;
constinit thread_local uint64_t t_rng __attribute__((tls_model("initial-exec"))) = 0;

// ---- malloc/calloc's unchecked path in sampled mode ---------------------------
// While g_sampling holds and no limit can make a small request fail, a request
// below kFastBelow bytes that the countdown leaves untracked goes to glibc by a
// tail call, its result unchecked. Checking it needs a frame of ours under
// glibc's: in a deep call chain that is one return more than the CPU's
// return-stack predictor holds, a misprediction on the way back up (about 4%
// of a malloc/free loop called through 16 frames, BENCHMARKS.md).
// Unchecked is safe where a small request cannot fail for lack of memory: no
// address-space (RLIMIT_AS) or data (RLIMIT_DATA) limit, and overcommit not
// strict (vm.overcommit_memory != 2). Then the kernel refuses only single
// mappings beyond RAM + swap, and a cgroup limit OOM-kills instead of failing
// a malloc. Otherwise every request takes the checked path. The limits are
// read at start, when the program sets one (setrlimit/prlimit are hooked),
// and at sample points at most every 100 ms (a limit lowered from outside
// with prlimit --pid). Not seen in sampled mode: a small malloc failing
// because vm.max_map_count or the 128 TiB address space ran out.
constexpr size_t kFastBelow = 64 << 10;
std::atomic<size_t> g_fast_below{0};        // kFastBelow or 0 (checked path)
std::atomic<bool> g_small_may_fail{true};   // until the limits are read
std::atomic<int64_t> g_limits_read_ns{0};  // CLOCK_MONOTONIC_COARSE

// Syscalls only: called inside malloc.
bool SmallRequestsMayFail() {
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (getrlimit(resource, &r) != 0 || r.rlim_cur != RLIM_INFINITY) return true;
  }
  const int fd = open("/proc/sys/vm/overcommit_memory", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // unknown: checked
  char mode = 0;
  const ssize_t got = read(fd, &mode, 1);
  close(fd);
  return got != 1 || mode == '2';
}
int64_t CoarseNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
// After g_sampling or the limits changed. A SIGUSR2 racing this may leave the
// unchecked path on with g_sampling off: the next sample point (through the
// checked path, which reads g_sampling) then notices the waiting snapshot.
void UpdateFastPath() {
  const bool on = g_sampling.load(std::memory_order_relaxed) && !g_small_may_fail.load(std::memory_order_relaxed);
  g_fast_below.store(on ? kFastBelow : 0, std::memory_order_relaxed);
}
// Leaves errno as it was: called inside malloc, and after setrlimit's own result.
void ReadLimits() {
  const int saved_errno = errno;
  g_limits_read_ns.store(CoarseNowNs(), std::memory_order_relaxed);
  g_small_may_fail.store(SmallRequestsMayFail(), std::memory_order_relaxed);
  UpdateFastPath();
  errno = saved_errno;
}

// Inside malloc: no stdio (it allocates), one write.
void WarnBadInterval(const char* value) {
  char msg[160];
  size_t n = 0;
  auto put = [&](const char* t, size_t max) {
    for (size_t i = 0; t[i] && i < max && n < sizeof msg - 1; ++i) msg[n++] = t[i];
  };
  put("spyglass: SPYGLASS_HEAP_SAMPLE_BYTES='", 64);
  put(value, 32);  // a bounded prefix of the value
  put("' is not an integer from 0 to 1073741824; tracking every allocation\n", 96);
  ssize_t w = write(2, msg, n);
  (void)w;
}

bool FollowChildren() {
  const char* f = getenv("SPYGLASS_HEAP_FOLLOW_CHILDREN");
  return f && f[0] == '1';
}

// Whether this process (just exec'd, or the first) is one to track: the
// program (SPYGLASS_HEAP_PID, or none set yet) or, when following children, any.
bool FollowedProcess() {
  const char* main = getenv("SPYGLASS_HEAP_PID");
  if (!main || !*main || FollowChildren()) return true;
  long pid = 0;
  for (const char* c = main; *c; ++c) {
    if (*c < '0' || *c > '9' || pid > (1l << 40)) return true;  // not a pid: no filtering
    pid = pid * 10 + (*c - '0');
  }
  return pid == getpid();
}

int InitState() {
  // Before the tracker's library is initialized, its dependencies are: their
  // allocations are not the program's (not stored: asked again next time).
  if (!g_initialized.load(std::memory_order_acquire)) return 2;
  const char* e = getenv("SPYGLASS_HEAP");
  int s = (e && e[0] == '0') || !FollowedProcess() ? 2 : 1;
  if (const char* iv = getenv("SPYGLASS_HEAP_SAMPLE_BYTES"); iv && *iv) {
    uint64_t v = 0;
    if (ParseSampleBytes(iv, &v)) {
      g_interval = v;
      if (v > 0) SetSampleInterval(v);
      if (v > 0 && s == 1) {
        g_free_filter = g_filter.load(std::memory_order_acquire);
        g_sampling.store(true, std::memory_order_relaxed);
        ReadLimits();
      }
    } else if (s == 1) {
      WarnBadInterval(iv);
    }
  }
  g_heap_state.store(s, std::memory_order_release);
  return s;
}

bool HeapStateSlow(int s);
inline bool HeapOn() {
  int s = g_heap_state.load(std::memory_order_relaxed);
  if (__builtin_expect(s == 1, 1)) return true;
  if (s == 2) return false;
  return HeapStateSlow(s);
}

}  // namespace

namespace spyglass::memory::heap {
uint32_t HeapClass() {
  uint32_t c = g_heap_class.load(std::memory_order_relaxed);
  if (__builtin_expect(c == 0, 0)) {
    c = InternClass("cpu:0", "heap");
    g_heap_class.store(c, std::memory_order_relaxed);
  }
  return c;
}
}  // namespace spyglass::memory::heap

namespace {
using spyglass::memory::heap::HeapClass;

// Exponential gap with mean g_interval (xorshift per thread).
int64_t NextGap() {
  t_rng ^= t_rng << 13;
  t_rng ^= t_rng >> 7;
  t_rng ^= t_rng << 17;
  double u = (static_cast<double>(t_rng >> 11) + 0.5) / 9007199254740992.0;
  return static_cast<int64_t>(-std::log(u) * static_cast<double>(g_interval)) + 1;
}

// The countdown reached zero (or the thread's first allocation): whether
// this allocation of n bytes is a sample. Each byte starts a sample with
// probability 1/g_interval, independently (the gaps are exponential and drawn
// afresh after each sample), so an allocation of n bytes is sampled with
// probability 1 - exp(-n/interval), the weight the snapshot divides by.
__attribute__((noinline)) bool SampledSlow() {
  if (CoarseNowNs() - g_limits_read_ns.load(std::memory_order_relaxed) > 100000000) ReadLimits();
  if (t_rng == 0) {
    // First allocation of this thread (or after fork): seed from the thread,
    // its TLS address and the clock, and start with a drawn gap; not a sample
    // by default (that would weigh every thread's first block as 1/p).
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t_rng = Mix(reinterpret_cast<uintptr_t>(&t_rng) ^ static_cast<uint64_t>(pthread_self()) * 0x100000001b3ull ^
                (static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec))) |
            1;
    t_until_sample += NextGap();  // it had gone from 0 to -n
    if (t_until_sample > 0) return false;
  }
  t_until_sample = NextGap();
  return true;
}

// Sampled mode: whether this allocation is one of the samples.
inline bool Sampled(size_t n) {
  if (g_interval == 0) return true;
  t_until_sample -= static_cast<int64_t>(n);
  if (__builtin_expect(t_until_sample > 0, 1)) return false;
  return SampledSlow();
}

pid_t g_pid = 0;                  // the process that loaded the hook
bool g_follow_children = false;  // SPYGLASS_HEAP_FOLLOW_CHILDREN=1
pid_t g_self = 0;                 // this process (kept up to date across forks)
pid_t g_forked_from = 0;          // in a forked child: the process that forked it

// A forked child (no exec) of a live parent, children not followed: a worker,
// whose history is its parent's; it writes no files (exit, dumps).
// Async-signal-safe.
bool QuietWorker() { return !g_follow_children && getpid() != g_pid && getppid() == g_forked_from; }

void ResetSnapshotThreadInChild();
// A fresh seed in a forked child (else it draws the parent's samples).
void ReseedChild() {
  t_rng = 0;
  t_until_sample = 0;
  ResetSnapshotThreadInChild();
  // Not getppid(): the parent may be gone already.
  g_forked_from = g_self;
  g_self = getpid();
}

// The recording half, out of line: the inline fast path of every hooked call
// stays a few instructions (no 512-byte frame array, no stack protector).
// `frame` is the hooked function's own frame, so the stack starts at its
// caller whichever unwinder runs (libunwind/glibc skip themselves, this
// function and the hook).
// The thread's previous stack and its site (frame-pointer unwinder): a
// loop allocating from one place walks the same stack again and again; the
// walk compares it on the way and skips hashing and the site lookup.
struct LastStack {
  uintptr_t frames[kHeapFrames];
  int depth;
  uint32_t site;
  uint32_t generation;
};
// Frames start at ~0, never a return address (CaptureFramePointersCompared).
constexpr LastStack InitialLastStack() {
  LastStack s{};
  for (uintptr_t& f : s.frames) f = ~uintptr_t{0};
  return s;
}
constinit thread_local LastStack t_last __attribute__((tls_model("initial-exec"))) = InitialLastStack();
// The cfi unwinder's two last walks (the one before is read while the next is
// written) and the site of the latest.
struct LastCfiWalks {
  CfiTrail walks[2];
  int latest;
  uint32_t site;
  uint32_t generation;
};
static_assert(kHeapFrames <= kCfiTrailFrames);
constinit thread_local LastCfiWalks t_cfi __attribute__((tls_model("initial-exec"))) = {};
// The same for CaptureNative (Python programs, whose stacks are spliced
// afterwards): a walk from json's encoder crossed ~30 eval-loop and
// generator frames that the previous walk had just unwound (the native
// walk was 18% of json.tool's profiled time). Its own pair: the site cached
// in t_cfi belongs to t_cfi's walks.
constinit thread_local LastCfiWalks t_native_cfi __attribute__((tls_model("initial-exec"))) = {};

__attribute__((noinline)) void TrackSlow(void* p, size_t n, void* frame, bool moving = false) {
  if (Guard::Enter()) {
    const uint32_t cls = HeapClass();
    uint32_t site;
    // A Python program: its frames in place of the interpreter's
    // (heap_python.cc); the same native stack is then no longer the same site.
    const bool python = spyglass::memory::heap::g_python_on.load(std::memory_order_relaxed);
    const Unwinder unwinder = CurrentUnwinder();
    if (unwinder == Unwinder::kCfi && !python) {
      bool same;
      uint64_t hash;
      const CfiTrail& prev = t_cfi.walks[t_cfi.latest];
      CfiTrail& cur = t_cfi.walks[t_cfi.latest ^ 1];
      int depth = CaptureCfiTrail(frame, &cur, &prev, kHeapFrames, &same, &hash);
      t_cfi.latest ^= 1;
      const uint32_t generation = g_site_generation.load(std::memory_order_acquire);
      if (same && t_cfi.site != 0 && t_cfi.generation == generation) {
        site = t_cfi.site;
      } else {
        site = InternStack(cls, cur.ra, depth, StackHashFinish(hash, cls, depth));
        t_cfi.site = site;
        t_cfi.generation = generation;
      }
    } else if (unwinder == Unwinder::kFramePointer && !python) {
      bool same;
      // The walk writes the stack into t_last, over the previous one.
      int depth = CaptureFramePointersCompared(frame, t_last.frames, kHeapFrames, t_last.depth, &same);
      const uint32_t generation = g_site_generation.load(std::memory_order_acquire);
      if (same && t_last.site != 0 && t_last.generation == generation) {
        site = t_last.site;
      } else {
        site = InternStack(cls, t_last.frames, depth, 0);
        t_last.depth = depth;
        t_last.site = site;
        t_last.generation = generation;
      }
    } else {
      namespace heap = spyglass::memory::heap;
      uintptr_t frames[kMaxFrames];
      // Light mode: the Python frames alone; a thread without them (no GIL) its native stack.
      // Inside pymalloc the block is recorded once pymalloc has returned (heap_python.cc).
      const bool light = python && heap::g_python_light.load(std::memory_order_relaxed);
      if (light && heap::StashLightBlock(p, n)) {
        Guard::Leave();
        return;
      }
      int depth = light ? heap::PythonFramesOnly(frames, kMaxFrames, moving) : 0;
      if (depth == 0) {
        depth = heap::CaptureNative(frame, frames, kHeapFrames);
        if (python) depth = heap::SplicePythonFrames(frames, depth, kMaxFrames);
      }
      site = InternStack(cls, frames, depth, 0);
    }
    RecordSite(reinterpret_cast<uintptr_t>(p), n, site);
    Guard::Leave();
  } else if (Guard::InsideTracking()) {
    Count(kReentrant);
  }
}

// An allocation of n > 0 bytes failed: the process is likely about to die of
// it. A raw dump, written from reserved memory (crash_dump.h); once.
bool WantFailure(size_t n) {
  // A size no allocator can give (over PTRDIFF_MAX: glibc refuses at once) is
  // a bad request, not memory running out.
  return n != 0 && n <= PTRDIFF_MAX && HeapOn() && !Guard::Inside() && !CrashDumpWritten() && !QuietWorker();
}
void DumpFailure(size_t n, const uintptr_t* frames, int depth) {
  FailedAllocation f{n, frames, depth};
  Guard::EnterOwn();
  WriteCrashDump(DumpReason::kOutOfMemory, 0, &f);
  Guard::Leave();
}
const void* g_hook_base = nullptr;  // this library's load address
__attribute__((noinline)) void AllocFailed(size_t n, void* frame) {
  if (!WantFailure(n)) return;
  const int saved_errno = errno;  // ENOMEM, for the program to read
  uintptr_t frames[kHeapFrames];
  // Both allocate nothing (a CFI miss reads .eh_frame in place).
  int depth = CurrentUnwinder() == Unwinder::kFramePointer ? CaptureFramePointers(frame, frames, kHeapFrames)
                                                            : CaptureCfi(frame, frames, kHeapFrames);
  // The stack from the program on: frames of the hook itself (operator new
  // reaching NewOrThrow through another of its functions) dropped.
  int skip = 0;
  for (Dl_info info{}; skip < depth && dladdr(reinterpret_cast<void*>(frames[skip] - 1), &info) &&
                       info.dli_fbase == g_hook_base;)
    ++skip;
  DumpFailure(n, frames + skip, depth - skip);
  errno = saved_errno;
}
}  // namespace

namespace spyglass::memory::heap {
// The DWARF unwinders drop their own frame, this one, the recording function
// and the hooked one (4): the stack starts at the hooked function's caller.
// noinline, and no tail calls (the asm): that count of frames stays true.
__attribute__((noinline)) int CaptureNative(void* frame, uintptr_t* out, int max) {
  int depth;
  switch (CurrentUnwinder()) {
    case Unwinder::kCfi: {
      bool same;
      uint64_t hash;
      const CfiTrail& prev = t_native_cfi.walks[t_native_cfi.latest];
      CfiTrail& cur = t_native_cfi.walks[t_native_cfi.latest ^ 1];
      depth = CaptureCfiTrail(frame, &cur, &prev, max < kCfiTrailFrames ? max : kCfiTrailFrames, &same, &hash);
      t_native_cfi.latest ^= 1;
      std::memcpy(out, cur.ra, sizeof(uintptr_t) * static_cast<size_t>(depth));
      break;
    }
    case Unwinder::kFramePointer: depth = CaptureFramePointers(frame, out, max); break;
    case Unwinder::kLibunwind: depth = CaptureLibunwind(out, max, 4); break;
    default: depth = CaptureGlibc(out, max, 4); break;
  }
  asm volatile("" : "+r"(depth));
  return depth;
}
bool ShouldTrack(size_t n) { return HeapOn() && Sampled(n); }
bool AllocationFailureWanted(size_t n) { return WantFailure(n); }
void AllocationFailed(size_t n, const uintptr_t* frames, int depth) { DumpFailure(n, frames, depth); }
bool MaybeTrackedFree(void* p) {
  return HeapOn() && (!g_interval || MaybeTrackedInline(reinterpret_cast<uintptr_t>(p)));
}
}  // namespace spyglass::memory::heap

namespace {

#define SPYGLASS_TRACK(p, n)                                                      \
  do {                                                                            \
    if ((p) && HeapOn() && Sampled(n)) TrackSlow((p), (n), __builtin_frame_address(0)); \
    else if (__builtin_expect(!(p), 0)) AllocFailed((n), __builtin_frame_address(0)); \
  } while (0)

__attribute__((noinline)) void UntrackSlow(void* p) {
  if (Guard::Enter()) {
    // Sampled mode: most blocks were never recorded (the filter lets a few of
    // them through), so an unknown pointer is no unknown free.
    if (g_interval)
      RemoveIfTracked(reinterpret_cast<uintptr_t>(p));
    else
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

__attribute__((noinline)) bool TakeSlow(void* p, LiveRecord* r) {
  if (!Guard::Enter()) {
    if (Guard::InsideTracking()) Count(kReentrant);
    return false;
  }
  bool taken = Take(reinterpret_cast<uintptr_t>(p), r);
  Guard::Leave();
  return taken;
}

__attribute__((noinline)) void RestoreSlow(const LiveRecord& r) {
  if (!Guard::Enter()) return;
  Restore(r);
  Guard::Leave();
}

// Light mode: a block put aside inside pymalloc and freed before pymalloc
// returned (heap_python.cc) was never recorded.
__attribute__((noinline)) bool FreedUnrecorded(void* p) {
  if (!spyglass::memory::heap::g_python_light.load(std::memory_order_relaxed) || !Guard::Enter()) return false;
  const bool was = spyglass::memory::heap::UnstashLightBlock(p);
  Guard::Leave();
  return was;
}
// realloc: the old record is taken out before the call (once the call
// returns, the old address may already be another thread's new block) and
// put back unchanged if the call fails: the block is still held, with its
// size and stack. `frame`: the hooked function's frame (see TrackSlow).
__attribute__((always_inline)) inline void* Realloc(void* old, size_t n, void* frame) {
  LiveRecord rec{};
  if (__builtin_expect(spyglass::memory::heap::g_python_light.load(std::memory_order_relaxed), 0) && old)
    FreedUnrecorded(old);  // put aside in this pymalloc call (light mode): not in the table
  bool taken = old && HeapOn() && (!g_interval || MaybeTrackedInline(reinterpret_cast<uintptr_t>(old))) &&
               TakeSlow(old, &rec);
  void* p = __libc_realloc(old, n);
  if (p == nullptr) {
    if (taken && n != 0) RestoreSlow(rec);  // n == 0: glibc freed the block
    AllocFailed(n, frame);
    return p;
  }
  if (HeapOn() && Sampled(n)) TrackSlow(p, n, frame, /*moving=*/true);
  return p;
}

// noinline: a failure's stack starts at its caller (the program, when
// operator new tail-jumps here; the hook's frames are dropped otherwise).
__attribute__((noinline)) void* NewOrThrow(size_t n, bool nothrow) {
  while (true) {
    void* p = __libc_malloc(n);
    if (p) return p;
    AllocFailed(n ? n : 1, __builtin_frame_address(0));
    std::new_handler h = std::get_new_handler();
    if (!h) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    h();
  }
}

__attribute__((noinline)) void* AlignedNewOrThrow(size_t n, size_t align, bool nothrow) {
  while (true) {
    void* p = __libc_memalign(align, n);
    if (p) return p;
    AllocFailed(n ? n : 1, __builtin_frame_address(0));
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
// Wakes the snapshot thread: SIGUSR2's handler adds 1 (write(2) on an
// eventfd is async-signal-safe); the thread polls it with the cgroup watch.
// Kept high and checked before each use (common/kept_fd.h): a daemon may have
// closed it and put its own file at that number.
spyglass::kept_fd::KeptFd g_wake;
void Wake(uint64_t n) {
  if (n == 0 || !spyglass::kept_fd::IsOurs(g_wake)) return;
  ssize_t w = write(g_wake.fd, &n, sizeof n);
  (void)w;
}
std::atomic<int> g_snapshots{0};
bool g_followed = false;         // this process is tracked (the program, or a followed child)

// D/memory.<pid>.<comm>.<tag>.prof (timeline.h names every file), with
// `comment` among the profile's comments.
void WriteSnapshot(const char* tag, const std::string& comment = "") {
  if (!g_dir) return;
  ScopedUntracked untracked;
  std::string path = *g_dir + "/" + spyglass::memory::MemoryProfileName(getpid(), spyglass::memory::SelfComm(), tag);
  std::string bytes;
  spyglass::Status s = spyglass::memory::SnapshotPprof(
      "", &bytes, comment.empty() ? std::vector<std::string>{} : std::vector<std::string>{comment});
  if (s.ok()) s = spyglass::exporter::WriteOutputBytes(path, bytes);
  if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.message().c_str());
}

// At exit: the live set now, the live set at the peak, and the series.
void WriteExitFiles() {
  if (!g_dir) return;
  ScopedUntracked untracked;
  WriteSnapshot("exit");
  const long pid = getpid();
  const std::string comm = spyglass::memory::SelfComm();
  spyglass::Status s =
      spyglass::memory::save_peak_profile(*g_dir + "/" + spyglass::memory::MemoryProfileName(pid, comm, "peak"));
  if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.message().c_str());
  s = spyglass::memory::SaveTimeline(*g_dir + "/" + spyglass::memory::MemoryTimelineName(pid, comm));
  if (!s.ok()) std::fprintf(stderr, "spyglass: %s\n", s.message().c_str());
}

// The snapshot thread is started at the first SIGUSR2, not at load: a
// process with a second thread makes glibc's malloc and free take their
// atomic paths (arena locks, fastbin CAS) and this tracker leave its
// single-writer mode, which cost a profiled program ~10 % when it never asks
// for a snapshot. The signal handler cannot start a thread; it marks the
// state, and the next malloc/free of any thread (or the exit) starts it.
// Under a cgroup memory limit it is started at load (it watches the limit).
std::atomic<bool> g_thread_started{false};
CgroupWatch* g_cgroup = nullptr;  // a cgroup memory limit watched (see below)
std::atomic<int> g_pending{0};  // SIGUSR2s waiting for the thread

void* SnapshotThread(void*);

void StartSnapshotThread() {
  ScopedUntracked untracked;
  if (!g_thread_started.exchange(true)) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);  // the helper thread takes no signals of the program
    if (pthread_create(&th, &attr, SnapshotThread, nullptr) != 0) g_thread_started.store(false);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    if (!g_thread_started.load()) return;  // the pending snapshots are written at exit
  }
  Wake(static_cast<uint64_t>(g_pending.exchange(0)));
}

// A forked child has no snapshot thread (threads do not survive fork).
void ResetSnapshotThreadInChild() {
  g_thread_started.store(false);
  // Its own wake-up (the parent's is shared) and no cgroup watch (the
  // parent's registrations are shared too).
  if (g_wake.fd >= 0) {
    spyglass::kept_fd::CloseIfOurs(&g_wake);
    g_wake = spyglass::kept_fd::Keep(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  }
  g_cgroup = nullptr;
}

bool HeapStateSlow(int s) {
  if (s == 0) return InitState() == 1;
  // 3 or 4: snapshots asked for before the thread existed.
  const int base = s - 2;
  // Before the state: a SIGUSR2 arriving after it clears the flag again.
  if (base == 1 && g_free_filter) {
    g_sampling.store(true, std::memory_order_relaxed);
    UpdateFastPath();
  }
  if (g_heap_state.compare_exchange_strong(s, base)) StartSnapshotThread();
  return g_heap_state.load(std::memory_order_relaxed) == 1;
}

// ---- a cgroup memory limit close to being hit ---------------------------------
// The snapshot thread waits on the kernel's notifications where it offers
// them, else polls (cgroup_watch.h); at 90% of the limit a snapshot is
// written, once until usage falls below 80% again. Its comment says how the
// limit was watched.
void CgroupSnapshot() {
  std::string comment = "spyglass: cgroup memory limit: usage " + std::to_string(g_cgroup->usage()) + " of " +
                        std::to_string(g_cgroup->limit()) + " bytes (" + g_cgroup->dir() + "), watched by " +
                        g_cgroup->how();
  WriteSnapshot("cgroup", comment);
}
std::atomic<bool> g_exit_written{false};

}  // namespace

void spyglass::memory::heap::WriteExitSnapshotOnce() {
  // Children not followed and workers of a live parent write nothing.
  if (!g_followed || QuietWorker()) return;
  if (g_exit_written.exchange(true)) return;
  // SIGUSR2s that never saw their thread start (no malloc/free since): written now.
  for (int n = g_pending.exchange(0); n > 0; --n) WriteSnapshot(std::to_string(g_snapshots.fetch_add(1) + 1).c_str());
  WriteExitFiles();
}

namespace {

void* SnapshotThread(void*) {
  pollfd fds[1 + CgroupWatch::kMaxFds];
  if (g_cgroup) {  // usage may be past 90% already
    ScopedUntracked untracked;
    if (g_cgroup->Check(fds, 0)) CgroupSnapshot();
  }
  while (true) {
    // Not polled once the program took its number over (a file would be always readable).
    fds[0] = {spyglass::kept_fd::IsOurs(g_wake) ? g_wake.fd : -1, POLLIN, 0};
    const int n = g_cgroup ? g_cgroup->PollFds(fds + 1) : 0;
    int rc = poll(fds, static_cast<nfds_t>(1 + n), g_cgroup ? g_cgroup->TimeoutMs() : -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return nullptr;
    }
    if (g_cgroup) {
      bool event = rc == 0;  // the polling mode's tick
      for (int i = 1; i <= n; ++i) event |= fds[i].revents != 0;
      ScopedUntracked untracked;
      if (event && g_cgroup->Check(fds + 1, n)) CgroupSnapshot();
    }
    if (fds[0].revents & POLLIN) {
      uint64_t asked = 0;
      if (!spyglass::kept_fd::IsOurs(g_wake) || read(g_wake.fd, &asked, sizeof asked) != sizeof asked) asked = 0;
      for (; asked > 0; --asked) WriteSnapshot(std::to_string(g_snapshots.fetch_add(1) + 1).c_str());
    }
  }
}

// ---- fatal signals --------------------------------------------------------------
// Signals whose default action ends the process: a raw dump first, then the
// default action (the process dies of the signal as it would have). Installed
// only where the program has left the default; a handler it installs later
// replaces ours.
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE,  SIGILL,  SIGABRT, SIGSYS, SIGTERM,
                                 SIGINT,  SIGHUP, SIGQUIT, SIGXCPU, SIGXFSZ, SIGPIPE};

void OnFatalSignal(int sig, siginfo_t* info, void*) {
  int saved = errno;
  if (!QuietWorker()) WriteCrashDump(DumpReason::kSignal, sig, nullptr);
  // SA_RESETHAND restored the default action (SA_NODEFER: a signal raised
  // again is delivered now).
  spyglass::signal_safe::ReraiseUnlessFault(sig, info);
  errno = saved;
}

// The real sigaction (the one after ours, see the interposer below), looked up
// before the first handler is installed; sigaction may run in a signal handler,
// where dlsym may not.
using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
std::atomic<SigactionFn> g_real_sigaction{nullptr};
SigactionFn RealSigaction() {
  SigactionFn f = g_real_sigaction.load(std::memory_order_acquire);
  if (!f) {
    f = reinterpret_cast<SigactionFn>(dlsym(RTLD_NEXT, "sigaction"));
    g_real_sigaction.store(f, std::memory_order_release);
  }
  return f;
}

// Whether a disposition is our dump-then-die handler, which stands in for the
// default one: the program is shown SIG_DFL, so that a runtime that installs
// its own handler only over the default (CPython's KeyboardInterrupt) still does.
bool IsOurFatalHandler(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == OnFatalSignal;
}
void ShowAsDefault(struct sigaction* sa) {
  sa->sa_handler = SIG_DFL;
  sa->sa_flags = 0;
  sigemptyset(&sa->sa_mask);
}

void InstallFatalHandlers() {
  // The main thread's handler runs on its own stack (a stack overflow leaves none).
  static constexpr size_t kAltStack = 64 << 10;
  void* alt = mmap(nullptr, kAltStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (alt != MAP_FAILED) {
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = kAltStack;
    stack_t old{};
    if (sigaltstack(nullptr, &old) == 0 && (old.ss_flags & SS_DISABLE)) sigaltstack(&ss, nullptr);
  }
  for (int sig : kFatalSignals) {
    SigactionFn real = RealSigaction();
    struct sigaction old {};
    if (!real || real(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_sigaction = OnFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    real(sig, &sa, nullptr);
  }
}

void OnSigusr2(int) {
  int saved = errno;
  if (g_thread_started.load()) {
    Wake(1);  // async-signal-safe; the snapshot thread does the work
  } else {
    g_pending.fetch_add(1);
    int s = g_heap_state.load();
    // malloc's paths check the state again
    g_fast_below.store(0, std::memory_order_relaxed);
    g_sampling.store(false, std::memory_order_relaxed);
    if (s == 1 || s == 2) g_heap_state.compare_exchange_strong(s, s + 2);  // the next malloc/free starts the thread
  }
  errno = saved;
}

// ---- SPYGLASS_TRACE_DIR & co.: the full library ----------------------------
// libspyglass.so.0 honours the SPYGLASS_* start-from-outside settings when it
// loads (src/session/env_start.h: one place for programs that link it and for
// those that get it here). This loads it when one is set: the copy the program
// already loaded, else the one next to this hook (installed or in the build
// tree, they lie side by side).
void LoadFullLibraryIfAsked() {
  bool asked = false;
  for (const char* name : {"SPYGLASS_TRACE_DIR", "SPYGLASS_SERVER_PORT", "SPYGLASS_FLIGHT_RECORDER"})
    if (const char* v = getenv(name); v && *v) asked = true;
  if (!asked || dlopen("libspyglass.so.0", RTLD_NOW | RTLD_NOLOAD)) return;
  std::string path = "libspyglass.so.0";
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&LoadFullLibraryIfAsked), &self) && self.dli_fname) {
    std::string hook = self.dli_fname;
    if (size_t slash = hook.rfind('/'); slash != std::string::npos) path = hook.substr(0, slash + 1) + path;
  }
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* why = dlerror();
    std::fprintf(stderr, "spyglass: SPYGLASS_TRACE_DIR/SERVER_PORT/FLIGHT_RECORDER is set but %s cannot be loaded (%s); not profiling\n",
                 path.c_str(), why ? why : "?");
  }
}

__attribute__((constructor)) void HeapInit() {
  ScopedUntracked untracked;
  g_pid = g_self = getpid();
  g_follow_children = FollowChildren();
  if (Dl_info info{}; dladdr(reinterpret_cast<void*>(&HeapInit), &info)) g_hook_base = info.dli_fbase;
  // The first process to load the hook is the program; what it execs stays
  // it (same pid), what it starts is a child.
  if (const char* m = getenv("SPYGLASS_HEAP_PID"); !m || !*m) setenv("SPYGLASS_HEAP_PID", std::to_string(g_pid).c_str(), 1);
  // A child not followed: nothing tracked, written or traced.
  g_followed = FollowedProcess();
  if (!g_followed) return;
  HeapOn();
  // A Python program: CPython is built without frame pointers; the default
  // unwinder (cfi, DWARF rules cached per return address) walks libpython
  // completely, the same stacks as libunwind, which was 22% of json.tool's
  // profiled time (BENCHMARKS.md, "Python programs: json.tool"). A lookup:
  // nothing of Python is loaded.
  bool python = dlsym(RTLD_DEFAULT, "Py_IsInitialized") != nullptr;
  pthread_atfork(nullptr, nullptr, ReseedChild);  // O(1): a thread-local reset
  if (const char* d = getenv("SPYGLASS_HEAP_PROFILE_DIR"); d && *d) {
    g_dir = new std::string(d);
    mkdir(d, 0755);  // the last component, if missing
    // Kept open for a dump from a dying process (no path lookup then, no allocation).
    int dir_fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0 && PrepareCrashDump(dir_fd)) InstallFatalHandlers();
    g_wake = spyglass::kept_fd::Keep(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    struct sigaction sa {};
    sa.sa_handler = OnSigusr2;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, nullptr);
    // A cgroup memory limit: the snapshot thread watches it from the start.
    if (const char* w = getenv("SPYGLASS_HEAP_CGROUP_WATCH"); !w || w[0] != '0') {
      g_cgroup = CgroupWatch::Open();
      if (g_cgroup) StartSnapshotThread();
    }
  }
  // A Python interpreter: not now. The spyglass package, where installed,
  // starts the same settings at interpreter start with the core it carries
  // (spyglass-autostart.pth, with the Python tracer); libspyglass loaded too
  // would be a second core in the process, whose protobuf descriptors the one
  // libprotobuf refuses (abort). The startup module (python_startup/, run
  // after the .pth files) calls spyglass_heap_load_full_library() when the
  // package started nothing.
  if (!python) LoadFullLibraryIfAsked();
}

__attribute__((destructor)) void HeapFini() {
  if (!g_followed) return;
  ScopedUntracked untracked;
  // A forked child that did not exec shares the parent's history; a snapshot
  // per child (symbolization included) made programs that fork a lot 100x
  // slower (a shell's subshells: dozens). A daemon's child (the process that
  // forked it gone, so it was reparented) is the program: it writes one.
  spyglass::memory::heap::WriteExitSnapshotOnce();
}

// For the Python startup module: libspyglass for SPYGLASS_TRACE_DIR & co.
// when the spyglass package did not start them (a Python without it).
extern "C" __attribute__((visibility("default"))) void spyglass_heap_load_full_library() {
  if (!g_followed) return;
  ScopedUntracked untracked;
  LoadFullLibraryIfAsked();
}

// ---- dlclose: names for stacks into a library about to be unloaded ---------
struct ModuleRange {
  uintptr_t base = 0, lo = 0, hi = 0;
  const char* name = nullptr;
  bool found = false;
};

int FindModule(dl_phdr_info* info, size_t, void* arg) {
  auto* m = static_cast<ModuleRange*>(arg);
  if (info->dlpi_addr != m->base || !info->dlpi_name || std::strcmp(info->dlpi_name, m->name) != 0) return 0;
  m->found = true;
  m->lo = UINTPTR_MAX;
  m->hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (start < m->lo) m->lo = start;
    if (start + ph.p_memsz > m->hi) m->hi = start + ph.p_memsz;
  }
  return 1;
}

bool ModuleLoaded(ModuleRange* m) {
  m->found = false;
  dl_iterate_phdr(FindModule, m);
  return m->found && m->lo < m->hi;
}

}  // namespace

#define SPYGLASS_HOOK extern "C" __attribute__((visibility("default"), noinline))

SPYGLASS_HOOK int dlclose(void* handle) {
  using DlcloseFn = int (*)(void*);
  static DlcloseFn real = reinterpret_cast<DlcloseFn>(dlsym(RTLD_NEXT, "dlclose"));
  if (!real) return -1;
  link_map* lm = nullptr;
  ModuleRange m;
  // Our own work is untracked; the real dlclose is not (the library's destructors free).
  if (!HeapOn() || !Guard::EnterOwn()) return real(handle);
  ModuleNames* names = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) {
    m.base = lm->l_addr;
    m.name = lm->l_name;
    if (ModuleLoaded(&m)) names = new ModuleNames(NamesBeforeUnload(m.lo, m.hi));
  }
  char name[4096];  // l_name goes away with the module (a copy on the stack: nothing to free untracked)
  std::snprintf(name, sizeof name, "%s", m.name ? m.name : "");
  m.name = name;
  Guard::Leave();
  int rc = real(handle);
  if (names && Guard::EnterOwn()) {
    if (rc == 0 && !ModuleLoaded(&m)) {  // still loaded: other handles hold it
      AfterUnload(*names);
      ForgetCfiRules(m.lo, m.hi);  // another module may be mapped there next
    }
    delete names;
    Guard::Leave();
  }
  return rc;
}

// The program sees the default disposition where our dump handler stands in
// for it (IsOurFatalHandler), and a handler it installs replaces ours. CPython
// asks through sigaction; signal() hands back our handler, which is restored
// as it should be.
SPYGLASS_HOOK int sigaction(int sig, const struct sigaction* act, struct sigaction* old) noexcept {
  SigactionFn real = RealSigaction();
  if (!real) return errno = ENOSYS, -1;
  const int rc = real(sig, act, old);
  if (rc == 0 && old && IsOurFatalHandler(*old)) ShowAsDefault(old);
  return rc;
}
// A limit the program sets (Python's resource.setrlimit too) turns sampled
// mode's unchecked malloc path off at once (g_fast_below).
template <typename Fn>
Fn NextSymbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}
template <typename Fn, typename... Args>
int ForwardThenReadLimits(Fn real, Args... args) {
  const int rc = real ? real(args...) : (errno = ENOSYS, -1);
  ReadLimits();
  return rc;
}
SPYGLASS_HOOK int setrlimit(__rlimit_resource_t resource, const struct rlimit* limit) noexcept {
  static const auto real = NextSymbol<decltype(&setrlimit)>("setrlimit");
  return ForwardThenReadLimits(real, resource, limit);
}
SPYGLASS_HOOK int setrlimit64(__rlimit_resource_t resource, const struct rlimit64* limit) noexcept {
  static const auto real = NextSymbol<decltype(&setrlimit64)>("setrlimit64");
  return ForwardThenReadLimits(real, resource, limit);
}
SPYGLASS_HOOK int prlimit(pid_t pid, __rlimit_resource resource, const struct rlimit* limit,
                          struct rlimit* old) noexcept {
  static const auto real = NextSymbol<decltype(&prlimit)>("prlimit");
  return ForwardThenReadLimits(real, pid, resource, limit, old);
}
SPYGLASS_HOOK int prlimit64(pid_t pid, __rlimit_resource resource, const struct rlimit64* limit,
                            struct rlimit64* old) noexcept {
  static const auto real = NextSymbol<decltype(&prlimit64)>("prlimit64");
  return ForwardThenReadLimits(real, pid, resource, limit, old);
}

#define SPYGLASS_FAST extern "C" __attribute__((visibility("default"), optimize("omit-frame-pointer")))

namespace {

// Takes n bytes off the thread's countdown: whether it reached zero. On
// x86-64 one subtraction in place whose flags decide (the compiler loads,
// subtracts, stores and tests: 3 more instructions on every malloc).
inline bool CountDown(size_t n) {
#if defined(__x86_64__)
  bool due;
  asm("subq %2, %0" : "+m"(t_until_sample), "=@ccle"(due) : "r"(static_cast<int64_t>(n)));
  return due;
#else
  t_until_sample -= static_cast<int64_t>(n);
  return t_until_sample <= 0;
#endif
}
// Whether an allocation of n bytes is recorded (advances the sampling countdown).
inline bool WillTrack(size_t n) {
  if (__builtin_expect(g_sampling.load(std::memory_order_relaxed), 1))
    return __builtin_expect(CountDown(n), 0) && SampledSlow();
  return HeapOn() && Sampled(n);
}
// malloc/calloc: tracking off, or on and this allocation not recorded (a
// failure is still reported), or recorded. One flag and the countdown in
// sampled mode; the state otherwise.
enum Decision { kOff, kUntracked, kTracked };
inline Decision Decide(size_t n) {
  if (__builtin_expect(g_sampling.load(std::memory_order_relaxed), 1))
    return __builtin_expect(CountDown(n), 0) && SampledSlow() ? kTracked : kUntracked;
  const int s = g_heap_state.load(std::memory_order_relaxed);
  if (s == 2) return kOff;
  if (s != 1 && !HeapStateSlow(s)) return kUntracked;  // not on after all: failures are still looked at
  return Sampled(n) ? kTracked : kUntracked;
}
// Whether a free of p must look into the tracker.
inline bool MayUntrack(void* p) {
  return p && HeapOn() && (!g_interval || MaybeTrackedInline(reinterpret_cast<uintptr_t>(p)));
}

// The live table's slot of this allocation's record: it lands while the
// stack is walked (here, not in TrackSlow: a call there made the walk's loop
// slower).
inline void PrefetchTrack(void* p) { PrefetchInsert(reinterpret_cast<uintptr_t>(p)); }

__attribute__((noinline)) void* MallocTracked(size_t n) {
  void* p = __libc_malloc(n);
  if (p) {
    PrefetchTrack(p);
    TrackSlow(p, n, __builtin_frame_address(0));
  } else {
    AllocFailed(n, __builtin_frame_address(0));
  }
  return p;
}
__attribute__((noinline)) void* CallocTracked(size_t n, size_t m) {
  void* p = __libc_calloc(n, m);
  size_t bytes;
  if (p)
    TrackSlow(p, n * m, __builtin_frame_address(0));
  else if (!__builtin_mul_overflow(n, m, &bytes))
    AllocFailed(bytes, __builtin_frame_address(0));
  return p;
}
// An untracked malloc/calloc failed (the fast path): the dump still names
// its site. Reached by a tail call from the hooked function, so this frame's
// caller is the program's.
__attribute__((noinline)) void* MallocFailed(size_t n) {
  AllocFailed(n, __builtin_frame_address(0));
  return nullptr;
}
__attribute__((noinline)) void* CallocFailed(size_t n, size_t m) {
  size_t bytes;
  if (!__builtin_mul_overflow(n, m, &bytes)) AllocFailed(bytes, __builtin_frame_address(0));
  return nullptr;
}
__attribute__((noinline)) void FreeTracked(void* p) {
  if (__builtin_expect(spyglass::memory::heap::g_python_light.load(std::memory_order_relaxed), 0) &&
      FreedUnrecorded(p))
    return __libc_free(p);
  if (!g_interval && Guard::Enter()) {
    // Complete stacks: the block may wait a few frees before glibc gets it
    // (RemoveSoon), so that the table slot and the chunk header it needs are
    // loaded by then.
    uintptr_t release[2];
    const int n = RemoveSoon(reinterpret_cast<uintptr_t>(p), release);
    Guard::Leave();
    for (int i = 0; i < n; ++i) __libc_free(reinterpret_cast<void*>(release[i]));
    return;
  }
  // Two cache misses of a long-lived block's free, overlapped: the live
  // table's slot (the erase) and the chunk header (glibc's free reads it next).
  PrefetchErase(reinterpret_cast<uintptr_t>(p));
  __builtin_prefetch(static_cast<char*>(p) - sizeof(size_t), 0, 3);
  UntrackSlow(p);
  __libc_free(p);
}
__attribute__((noinline)) void* NewTracked(size_t n, bool nothrow) {
  void* p = NewOrThrow(n, nothrow);
  if (p) {
    PrefetchTrack(p);
    TrackSlow(p, n, __builtin_frame_address(0));
  }
  return p;
}

}  // namespace

namespace {
// Every malloc but the unchecked path's (g_fast_below).
__attribute__((noinline, optimize("omit-frame-pointer"))) void* MallocChecked(size_t n) {
  const Decision d = Decide(n);
  if (__builtin_expect(d == kUntracked, 1)) {
    // Not recorded (sampled mode), but a failure still is: the OOM dump
    // names this call's site. MallocFailed is a tail call: its stack starts here.
    void* p = __libc_malloc(n);
    if (__builtin_expect(p != nullptr, 1)) return p;
    return MallocFailed(n);
  }
  if (d == kOff) return __libc_malloc(n);  // a jump; no dump is written anyway
  return MallocTracked(n);
}
__attribute__((noinline, optimize("omit-frame-pointer"))) void* CallocChecked(size_t n, size_t m) {
  const Decision d = Decide(n * m);
  if (__builtin_expect(d == kUntracked, 1)) {
    void* p = __libc_calloc(n, m);
    if (__builtin_expect(p != nullptr, 1)) return p;
    return CallocFailed(n, m);
  }
  if (d == kOff) return __libc_calloc(n, m);
  return CallocTracked(n, m);
}
}  // namespace

// Each reaches its checked path, or glibc, by a tail call: the tracked path's
// stack starts at the program's frame, and the unchecked one adds no return.
SPYGLASS_FAST void* malloc(size_t n) {
  if (__builtin_expect(n < g_fast_below.load(std::memory_order_relaxed), 1)) {
    if (__builtin_expect(!CountDown(n), 1)) return __libc_malloc(n);
    t_until_sample += static_cast<int64_t>(n);  // a sample point: the checked path counts it again
  }
  return MallocChecked(n);
}
SPYGLASS_FAST void* calloc(size_t n, size_t m) {
  size_t bytes;
  if (__builtin_expect(!__builtin_mul_overflow(n, m, &bytes) && bytes < g_fast_below.load(std::memory_order_relaxed), 1)) {
    if (__builtin_expect(!CountDown(bytes), 1)) return __libc_calloc(n, m);
    t_until_sample += static_cast<int64_t>(bytes);
  }
  return CallocChecked(n, m);
}
namespace {
// free() before the state is known, or with SIGUSR2 snapshots pending
// (out of line: free's own path then needs no frame).
__attribute__((noinline)) void FreeStateSlow(void* p) {
  if (MayUntrack(p)) return FreeTracked(p);
  return __libc_free(p);
}
// Sampled mode, the filter's slot of p taken (a null free reads slot 0).
__attribute__((noinline)) void FreeFiltered(void* p) {
  if (p) return FreeTracked(p);
}
}  // namespace

SPYGLASS_FAST void free(void* p) {
  if (const uint64_t* f = g_free_filter) {
    if (__builtin_expect(!FilterHas(f, reinterpret_cast<uintptr_t>(p)), 1)) return __libc_free(p);
    return FreeFiltered(p);
  }
  const int s = g_heap_state.load(std::memory_order_relaxed);
  if (__builtin_expect(s == 1, 1)) {
    if (p && (!g_interval || MaybeTrackedInline(reinterpret_cast<uintptr_t>(p)))) return FreeTracked(p);
    return __libc_free(p);
  }
  if (s == 2 || !p) return __libc_free(p);
  return FreeStateSlow(p);
}
SPYGLASS_HOOK void* realloc(void* old, size_t n) { return Realloc(old, n, __builtin_frame_address(0)); }
SPYGLASS_HOOK void* reallocarray(void* old, size_t n, size_t m) {
  size_t bytes;
  if (__builtin_mul_overflow(n, m, &bytes)) {
    errno = ENOMEM;
    return nullptr;  // the old block is untouched
  }
  return Realloc(old, bytes, __builtin_frame_address(0));
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

__attribute__((visibility("default"), noinline, optimize("omit-frame-pointer"))) void* operator new(size_t n) {
  if (__builtin_expect(!WillTrack(n), 1)) return NewOrThrow(n, false);
  return NewTracked(n, false);
}
__attribute__((visibility("default"), noinline, optimize("omit-frame-pointer"))) void* operator new[](size_t n) {
  if (__builtin_expect(!WillTrack(n), 1)) return NewOrThrow(n, false);
  return NewTracked(n, false);
}
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

#define SPYGLASS_DELETE_BODY(p)                  \
  if (__builtin_expect(!MayUntrack(p), 1)) return __libc_free(p); \
  return FreeTracked(p)
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
