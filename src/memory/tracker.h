// The allocation tracker: a sharded live table (pointer -> size, site) and a
// lock-free table of deduplicated sites (device/kind class + stack).
//
// Memory: a live record is 16 bytes (pointer; size:40 | site:24) in an open-
// addressing table kept between 53% and 80% full, i.e. 20-30 bytes per live
// allocation; a site is stored once (24 + 8 * frames bytes). All tables are
// mmap'd, never malloc'd, so the heap hook can use them at any time (before
// constructors, after destructors, inside malloc).
//
// Locks: a spinlock per shard (256 shards by pointer hash), held for a few
// dozen instructions and never across a call that may allocate. The site
// table is insert-only and lock-free. A thread-local guard makes calls from
// inside the tracker (a signal handler interrupting it, the profiler's own
// allocations) pass through untracked and counted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#define SPYGLASS_MEM_EXPORT __attribute__((visibility("default")))

namespace spyglass::memory::internal {

inline constexpr int kMaxFrames = 128;
inline constexpr uint32_t kMaxClasses = 255;     // (device, kind) pairs
inline constexpr uint64_t kMaxSize = (1ull << 40) - 1;

// A (device, kind) pair, interned. Index 0 is never used.
SPYGLASS_MEM_EXPORT uint32_t InternClass(std::string_view device, std::string_view kind);
SPYGLASS_MEM_EXPORT std::string_view ClassDevice(uint32_t cls);
SPYGLASS_MEM_EXPORT std::string_view ClassKind(uint32_t cls);
SPYGLASS_MEM_EXPORT uint32_t ClassCount();  // classes are 1..ClassCount()

// Thread-local reentrancy guard: 0 outside, 1 inside a tracking operation,
// 2 inside the profiler's own work. Inline (the heap hook enters it on every
// tracked call; a call into this library through the PLT cost more than it).
SPYGLASS_MEM_EXPORT extern constinit thread_local int t_guard __attribute__((tls_model("initial-exec")));
struct Guard {
  // false when the thread is already inside (then the caller must not track).
  static bool Enter() {
    if (t_guard) return false;
    t_guard = 1;
    return true;
  }
  static void Leave() { t_guard = 0; }
  static bool Inside() { return t_guard != 0; }
  // The profiler's own work (snapshots): its allocations are untracked and not counted.
  static bool EnterOwn() {
    if (t_guard) return false;
    t_guard = 2;
    return true;
  }
  // Whether the thread is inside a tracking operation (not the profiler's own work).
  static bool InsideTracking() { return t_guard == 1; }
  // Marks the thread's current work as the profiler's own (its allocations are
  // untracked and not counted as reentrant) and returns the previous state
  // for Restore: a tracking operation that calls libc code which allocates.
  static int BeginOwn() {
    int previous = t_guard;
    t_guard = 2;
    return previous;
  }
  static void Restore(int previous) { t_guard = previous; }
};
// RAII guard for the profiler's own work (snapshots): allocations inside are untracked.
class ScopedUntracked {
 public:
  ScopedUntracked() : entered_(Guard::EnterOwn()) {}
  ~ScopedUntracked() {
    if (entered_) Guard::Leave();
  }

 private:
  bool entered_;
};

inline uint64_t Mix(uint64_t x) {
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return x;
}

// The stack hash: a multiply and a rotate of each frame with its depth i, the
// terms xor'ed, then finished with the class and depth. The terms do not wait
// on each other (only the xor chains them): an unwinder folds them into its
// walk without lengthening it.
inline constexpr uint64_t kStackHashSeed = 0x243F6A8885A308D3ull;
inline uint64_t StackHashStep(uint64_t h, uintptr_t frame, int i) {
  uint64_t x = (frame + static_cast<uint64_t>(i) * 0xD6E8FEB86659FD93ull) * 0x9E3779B97F4A7C15ull;
  return h ^ ((x << 29) | (x >> 35));
}
inline uint64_t StackHashFinish(uint64_t h, uint32_t cls, int depth) {
  return Mix(h ^ (static_cast<uint64_t>(cls) << 40) ^ static_cast<uint64_t>(depth) * 0x100000001b3ull);
}
// The site id of (cls, frames[0..depth)) whose StackHashFinish is `hash`,
// interned if new; `cls` when the site table is full (counted). Caller holds the guard.
SPYGLASS_MEM_EXPORT uint32_t InternStack(uint32_t cls, const uintptr_t* frames, int depth, uint64_t hash);
// Records an allocation at a site InternStack returned (or a class id: no stack).
SPYGLASS_MEM_EXPORT void RecordSite(uintptr_t ptr, uint64_t size, uint32_t site);
// Bumped when sites' frames are rewritten (RewriteSiteFrames): a cache of
// stack -> site made before must be dropped.
SPYGLASS_MEM_EXPORT extern std::atomic<uint32_t> g_site_generation;

// Records an allocation whose stack is `frames[0..depth)` (innermost first,
// return addresses). Caller holds the guard. `sampled` marks heap-hook
// samples (weighted at snapshot time).
SPYGLASS_MEM_EXPORT void Record(uintptr_t ptr, uint64_t size, uint32_t cls, const uintptr_t* frames, int depth);
// Removes `ptr`; counts unknown/double frees. Caller holds the guard.
SPYGLASS_MEM_EXPORT void Remove(uintptr_t ptr);
// The heap hook's free (glibc's blocks only): in single-writer mode the
// free may wait a few frees ("waiting frees", tracker.cc) so that its two
// cache misses (the table slot, glibc's chunk header) are loaded by then.
// Writes to `release` the blocks to hand to glibc now, in order (`ptr`
// itself, or the block freed kWaiting frees ago, or both copies of a double
// free) and returns how many (0-2). The peak, the timeline and the live
// table stay exact (see SettleFrees). Caller holds the guard.
SPYGLASS_MEM_EXPORT int RemoveSoon(uintptr_t ptr, uintptr_t release[2]);
// RemoveIfTracked for a block the caller has already handed back to its
// allocator (Python's pymalloc, whose free is cheap and must not wait):
// in single-writer mode its erase waits in the same ring as RemoveSoon's
// (its table slot prefetched), and an Insert of the same address, reused
// meanwhile, erases it first. Exact as RemoveSoon. Caller holds the guard.
SPYGLASS_MEM_EXPORT void RemoveLater(uintptr_t ptr);
// Counts the waiting frees now: call before reading totals, site values,
// counters or LiveCount (the API and the heap hook's files do). From the
// writing thread it settles them; from another, it switches to shared mode
// (as a snapshot does). Not inside a tracking operation.
SPYGLASS_MEM_EXPORT void SettleFrees();
// Removes `ptr` if it is tracked; returns whether it was. Counts nothing when
// it is not (for hooks that see frees of memory allocated before they were
// installed). Caller holds the guard.
SPYGLASS_MEM_EXPORT bool RemoveIfTracked(uintptr_t ptr);
// Sampled mode: a quick test whether `ptr` may be tracked (no false negatives).
SPYGLASS_MEM_EXPORT bool MaybeTracked(uintptr_t ptr);
// Start loading the live-table slot that the coming record of `ptr`
// (PrefetchInsert: an allocation's, before its stack is walked) or its
// removal (PrefetchErase: a free's, before the real free) will touch, so that
// the cache miss overlaps other work instead of stalling the table operation.
// Only hints: no lock, no guard needed, never fault.
SPYGLASS_MEM_EXPORT void PrefetchInsert(uintptr_t ptr);
SPYGLASS_MEM_EXPORT void PrefetchErase(uintptr_t ptr);

// One live record, as a snapshot sees it.
struct LiveRecord {
  uintptr_t ptr;
  uint64_t size;
  uint32_t site;
};
// realloc: removes `ptr` if tracked and returns its record in `*out` (counts
// nothing when it is not tracked), so that a failed call can put it back
// unchanged with Restore (same size, same stack). Caller holds the guard.
SPYGLASS_MEM_EXPORT bool Take(uintptr_t ptr, LiveRecord* out);
// Puts back a record that Take returned (undoes its free count). Caller holds the guard.
SPYGLASS_MEM_EXPORT void Restore(const LiveRecord& r);

// The sampled-mode filter, mapped when sampling is turned on: one bit per
// slot (a 16-byte address granule, modulo 65536), set while a sampled live
// block is in the slot; the count of such blocks per slot lies after the
// bits, and the two change together under a lock (sampled blocks only: rare).
// Inline so that the heap hook's free() decides "never sampled" without a
// call into this library. 8 KiB of bits: it stays in the L1 cache, where 64
// KiB of byte counts missed it on random frees (2% of a malloc/free loop,
// BENCHMARKS.md; at 4 MiB, a third of sampled mode's cost). A false positive
// costs a table lookup; they stay rare while the live samples are far fewer
// than 65536 (at 512 KiB sampling: a live heap well under 32 GiB).
inline constexpr uint64_t kFilterSlots = 1ull << 16;
SPYGLASS_MEM_EXPORT extern std::atomic<uint64_t*> g_filter;
// Heap blocks are 16-byte aligned and spread out: the address bits are index enough.
inline uint64_t FilterIndex(uintptr_t ptr) { return (ptr >> 4) & (kFilterSlots - 1); }
inline bool FilterHas(const uint64_t* filter, uintptr_t ptr) {
  const uint64_t i = FilterIndex(ptr);
  return (__atomic_load_n(&filter[i / 64], __ATOMIC_RELAXED) >> (i % 64)) & 1;
}
inline bool MaybeTrackedInline(uintptr_t ptr) {
  const uint64_t* f = g_filter.load(std::memory_order_relaxed);
  return !f || FilterHas(f, ptr);
}
// The sampling interval (bytes, mean of the exponential gaps): 0 = every
// allocation, else at most kMaxSampleBytes (larger means one sample per
// program: useless, and the weights lose precision).
inline constexpr uint64_t kMaxSampleBytes = 1ull << 30;
SPYGLASS_MEM_EXPORT void SetSampleInterval(uint64_t bytes);  // clamped to kMaxSampleBytes
SPYGLASS_MEM_EXPORT uint64_t SampleInterval();
// Parses a sampling interval: decimal digits only (no sign, no spaces), 0 to
// kMaxSampleBytes. Allocation-free (the heap hook calls it inside malloc).
SPYGLASS_MEM_EXPORT bool ParseSampleBytes(const char* text, uint64_t* out);

// ---- symbolic frames ---------------------------------------------------------
// A stack word is either a return address or a symbolic frame: bit 63 set,
// bits 32..62 a function id (InternFunction), bits 0..31 the line. Sites hold
// both kinds alike (deduplicated, compared as words); the snapshot turns a
// symbolic frame into a pprof Location(line) of a Function(name, filename)
// instead of symbolizing it. User-space return addresses never have bit 63 set.
inline constexpr uintptr_t kSymbolicBit = uintptr_t{1} << 63;
inline constexpr uint32_t kMaxFunctions = 1u << 20;  // distinct (function, file) pairs
inline constexpr size_t kMaxFunctionChars = 1024;    // longer names/files are cut
inline uintptr_t SymbolicFrame(uint32_t function, int64_t line) {
  uint32_t l = line < 0 ? 0u : line > 0xffffffffll ? 0xffffffffu : static_cast<uint32_t>(line);
  return kSymbolicBit | (static_cast<uintptr_t>(function & 0x7fffffffu) << 32) | l;
}
inline bool IsSymbolicFrame(uintptr_t w) { return (w & kSymbolicBit) != 0; }
inline uint32_t SymbolicFunction(uintptr_t w) { return static_cast<uint32_t>((w >> 32) & 0x7fffffffu); }
inline int64_t SymbolicLine(uintptr_t w) { return static_cast<int64_t>(w & 0xffffffffu); }
// Interns (function name, file) once; returns its id (>= 1), or 0 when the
// function table is full (counted: kDroppedFunctions; the frame then reads
// "<unknown>"). Lock-free, allocation-free (mmap), safe inside the guard.
SPYGLASS_MEM_EXPORT uint32_t InternFunction(std::string_view name, std::string_view file);
// The names of function `id`; false for 0 or an unknown id.
SPYGLASS_MEM_EXPORT bool FunctionNames(uint32_t id, std::string_view* name, std::string_view* file);
SPYGLASS_MEM_EXPORT uint64_t FunctionCount();
SPYGLASS_MEM_EXPORT uint64_t FunctionBytes();

// Counted events (relaxed counters).
enum Counter : int {
  kAllocations, kFrees, kUnknownFrees, kDoubleFrees, kReplaced, kReentrant, kDroppedTable, kDroppedStacks,
  kCounterDropped, kDroppedFunctions,
  kCutStacks,  // a stack ended at a frame the unwinder could not unwind (unwind.h)
  kNumCounters
};
SPYGLASS_MEM_EXPORT void Count(Counter c, uint64_t n = 1);
SPYGLASS_MEM_EXPORT uint64_t CounterValue(Counter c);

// Calls `f` for each live record, shard by shard (each shard locked while
// read; `f` must not allocate through the tracker: call with ScopedUntracked).
SPYGLASS_MEM_EXPORT void ForEachLive(const std::function<void(const LiveRecord&)>& f);
SPYGLASS_MEM_EXPORT uint64_t LiveCount();
SPYGLASS_MEM_EXPORT uint64_t TableBytes();

// What is live from one site (or one class, for records without a stack),
// and what was live from it at its device's latest peak (see "Peak" below).
// Counts are in units of kCountUnit so that sampled records add their
// fractional weight exactly.
inline constexpr int64_t kCountUnit = 1024;
struct SiteStats {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> count{0};  // x kCountUnit
  std::atomic<uint64_t> stamp{0};  // the device's peak epoch when peak_* were saved
  std::atomic<int64_t> peak_bytes{0};
  std::atomic<int64_t> peak_count{0};
};
struct Site {
  uint64_t hash;
  uint32_t cls;
  uint32_t depth;
  SiteStats stats;
  uintptr_t frames[];  // innermost first: return addresses or symbolic frames
};
// nullptr for id 0 (no stack) or an id being published.
SPYGLASS_MEM_EXPORT const Site* GetSite(uint32_t id);
SPYGLASS_MEM_EXPORT uint32_t SiteClass(uint32_t id);
SPYGLASS_MEM_EXPORT uint64_t SiteCount();
SPYGLASS_MEM_EXPORT uint64_t SiteBytes();
// Replaces, in every site, the return addresses in [lo, hi) by `to(pc)` when
// non-zero (a symbolic frame): a module about to go away keeps its names.
// Sites stay where they are (a new allocation with the raw stack makes a new site).
SPYGLASS_MEM_EXPORT void RewriteSiteFrames(uintptr_t lo, uintptr_t hi, const std::function<uintptr_t(uintptr_t)>& to);

// Trace counter samples: while a session runs, every record/remove appends
// (ticks, class, delta) to a bounded buffer (lock-free: one fetch_add).
struct CounterEvent {
  uint64_t ticks;
  int64_t delta_and_class;  // delta << 8 | class
};
SPYGLASS_MEM_EXPORT extern std::atomic<bool> g_counter_on;
// Starts recording (capacity events); returns false if already recording.
SPYGLASS_MEM_EXPORT bool CounterStart(uint64_t capacity);
// Stops; returns the events (the buffer is released afterwards by CounterRelease).
SPYGLASS_MEM_EXPORT void CounterStop(const CounterEvent** events, uint64_t* n, uint64_t* dropped);
SPYGLASS_MEM_EXPORT void CounterRelease();

// Live bytes per class now (index = class).
SPYGLASS_MEM_EXPORT std::vector<int64_t> LiveBytesByClass();

// ---- devices and the peak ----------------------------------------------------
// Classes of the same device name share one device (index 0..DeviceCount()-1).
// Each device keeps its live bytes and its high-water mark. The peak's live
// set is remembered lazily, without a snapshot on each new peak: every new
// peak of a device bumps its epoch; a site (SiteStats) changed for the first
// time since the latest peak of its device first saves its value before the
// change (peak_bytes/peak_count, stamp = epoch). At any later time a site's
// value at the peak is its saved value if its stamp is the current epoch,
// else its current value (it has not changed since). Cost: two relaxed
// loads and a compare per record/remove, plus four stores on the first touch
// of a site after a new peak.
// Exactness: exact in a single thread. With threads the device total and a
// site's value are updated one after the other (not as one atomic step), so
// a site's value at the peak may include or miss the records other threads
// were making at that instant (at most one in-flight record per thread).
// Sampled records count with their weight (bytes / (1 - exp(-bytes/interval))).
inline constexpr uint32_t kMaxDevices = 64;  // more device names share the last one
SPYGLASS_MEM_EXPORT uint32_t DeviceCount();
SPYGLASS_MEM_EXPORT std::string_view DeviceName(uint32_t device);
SPYGLASS_MEM_EXPORT uint32_t ClassDeviceIndex(uint32_t cls);
struct DeviceTotals {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;  // high-water mark of live_bytes since start (or fork)
  uint64_t peak_epoch = 0;  // number of times the peak rose
};
SPYGLASS_MEM_EXPORT DeviceTotals GetDeviceTotals(uint32_t device);
// The highest live bytes of `device` since the previous call (then restarts
// from the current value): the timeline's per-interval maximum.
SPYGLASS_MEM_EXPORT int64_t TakeWindowMax(uint32_t device);
// The stats of site id (or class id below the first site); nullptr if unknown.
SPYGLASS_MEM_EXPORT const SiteStats* GetSiteStats(uint32_t id);
// First id of a site with a stack (ids below are classes), and one past the last.
SPYGLASS_MEM_EXPORT uint32_t FirstSiteId();
SPYGLASS_MEM_EXPORT uint32_t EndSiteId();
// A site's value (bytes, count x kCountUnit) now or at its device's latest peak.
struct SiteValue {
  int64_t bytes = 0, count = 0;
};
SPYGLASS_MEM_EXPORT SiteValue SiteNow(uint32_t id);
SPYGLASS_MEM_EXPORT SiteValue SiteAtPeak(uint32_t id);
// A forked child starts its own history: peak = live now, timeline emptied.
SPYGLASS_MEM_EXPORT void ResetPeaks();
// Called by the tracker every kTimelineCheckOps records/removes of a thread
// (timeline.cc): takes a timeline point when its interval has passed.
SPYGLASS_MEM_EXPORT void TimelineTick();

// Explicit API switch.
SPYGLASS_MEM_EXPORT extern std::atomic<bool> g_api_enabled;

// Set when this library's constructor has run. The libraries it depends on
// (libstdc++, libm, zlib...) are initialized before it, the program's own
// libraries after it: the heap hook records from then on, so that what the
// profiler's dependencies allocate while they initialize (libstdc++'s 71 KiB
// exception pool, which a C program would not have) is not in the profile.
// A C++ program's profile no longer shows that pool either: no code of the
// program allocated it.
SPYGLASS_MEM_EXPORT extern std::atomic<bool> g_initialized;

// fork: the child keeps the parent's live records (its copy of the heap) and
// resets the locks.
SPYGLASS_MEM_EXPORT void InstallForkHandlers();

// ---- crash dumps (memory/crash_dump.cc) ----------------------------------------
// For a dump from a signal handler or a failed allocation: calls `visit` for
// each live record, under its shard's lock, allocating nothing. A shard whose
// lock is not had within a bounded wait (held by a thread that crashed in it)
// is skipped; returns how many were.
SPYGLASS_MEM_EXPORT uint32_t ForEachLiveNoAlloc(void (*visit)(const LiveRecord& r, void* ctx), void* ctx);
// Ids of sites and functions are below these (for a dump's bitmaps).
SPYGLASS_MEM_EXPORT uint32_t SiteIdEnd();
SPYGLASS_MEM_EXPORT uint32_t FunctionIdEnd();

}  // namespace spyglass::memory::internal
